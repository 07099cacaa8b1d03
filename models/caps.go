package models

// Caps are what the database underneath can do, named for what the callers
// outside this package need, so that they never ask which database it is.
// PostgreSQL has every capability; embedded SQLite (one process, one writer)
// has none of them.
type Caps struct {
	// HotPath: the workers' everyday calls (claim, status report,
	// heartbeat, submit) may run as one statement each (ClaimTasksHot,
	// UpdateTasksHot, HeartbeatHot, SubmitTaskHot), authorization and
	// event outbox row included.
	HotPath bool
	// Listen: the database carries LISTEN/NOTIFY, so an event bus between
	// nodes can run over Pool (events.PGBus).
	Listen bool
	// Outbox: a mutation can write the events it causes into the outbox
	// table in its own transaction, for a relay to send after commit
	// (RelayOutbox).
	Outbox bool
	// SharedResultCache: provider results are kept in the database, shared
	// by every node and woken by NOTIFY; without it each process keeps its
	// own cache in memory.
	SharedResultCache bool
	// SharedSessions: the sessions of disconnected sockets are kept in the
	// database (SaveSocketSession), so a client may recover on any node.
	SharedSessions bool
}

// Caps reports what the database can do.
func (db *DB) Caps() Caps {
	pg := db.dialect == Postgres && db.Pool != nil
	return Caps{HotPath: pg, Listen: pg, Outbox: pg, SharedResultCache: pg, SharedSessions: pg}
}
