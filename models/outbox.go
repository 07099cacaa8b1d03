package models

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// The event outbox (PostgreSQL). A mutation whose events other nodes must
// hear writes their NOTIFY payloads as rows of joblib_event_outbox in its own
// statement or transaction, with no NOTIFY there: a notifying transaction
// holds PostgreSQL's notify-queue lock from its pre-commit to its end, WAL
// flush included, so notifying mutations would commit one at a time. A relay
// (RelayOutbox) then sends the committed rows with NOTIFY in id order and
// deletes them in the same transaction: an event is sent once its change has
// committed, never without it, and exactly once unless PostgreSQL itself
// crashes. For two events of one task the later one's row is written after
// the earlier one's change has committed (the task row lock orders them), so
// its id is larger and the relay sends them in order.

// WriteOutbox adds an event payload to the outbox inside the transaction.
func (q *Q) WriteOutbox(payload string) error {
	if q.d != Postgres {
		return ErrNoHotPath
	}
	if err := q.g.Exec("INSERT INTO joblib_event_outbox (payload) VALUES (?)", payload).Error; err != nil {
		return fmt.Errorf("write event outbox: %w", mapErr(err))
	}
	return nil
}

// outboxLockKey is the advisory lock that serialises the relays of one
// schema across nodes, so that the rows go out in id order however many
// nodes relay.
const outboxLockKey = "hashtext('joblib:outbox'), hashtext(current_schema())"

// outboxLockSQL waits for the relay lock.
const outboxLockSQL = "SELECT pg_advisory_xact_lock(" + outboxLockKey + ")"

// relaySQL deletes up to $2 of the oldest committed outbox rows and sends
// each with pg_notify on channel $1, in id order (the sort sits under the
// aggregate, so the notifications are queued in that order), if it holds
// the relay lock or can take it at once; its first column says whether it
// did. The rows are found by their keys, as an array: joined on the
// subquery (id IN (…)), the generic plan PostgreSQL caches after five
// executions hashed a sequential scan of the table, whose dead rows (every
// event sent since the last vacuum, up to a minute of them) outnumber the
// live ones by far.
//
// When the lock is taken here rather than by outboxLockSQL before, the
// statement's snapshot is older than the lock: a pass that committed in
// between may have deleted rows this snapshot still sees. DELETE skips a row
// a committed transaction deleted, so such rows are neither returned nor
// sent twice; at worst this pass sends fewer rows than it could, and the
// next one sends the rest.
const relaySQL = `WITH l AS MATERIALIZED (
	SELECT pg_try_advisory_xact_lock(` + outboxLockKey + `) AS held
), d AS (
	DELETE FROM joblib_event_outbox WHERE id = ANY(ARRAY(SELECT id FROM joblib_event_outbox WHERE (SELECT held FROM l) ORDER BY id LIMIT $2))
	RETURNING id, payload
)
SELECT (SELECT held FROM l), count(pg_notify($1, s.payload)) FROM (SELECT id, payload FROM d ORDER BY id) s`

// RelayOutbox sends up to limit committed outbox rows on channel and
// deletes them, in one round trip, and returns how many it sent. With wait
// it waits for the relay lock (the lock and the statement go as one
// pipeline, which PostgreSQL runs as one implicit transaction: the
// statement's snapshot is taken after the lock is granted, so it sees every
// row the previous relay left). Without, it returns busy, having sent
// nothing, when another relay holds the lock: that relay, or the next, sends
// what has committed.
func (db *DB) RelayOutbox(ctx context.Context, channel string, limit int, wait bool) (sent int, busy bool, err error) {
	if db.Pool == nil {
		return 0, false, ErrNoHotPath
	}
	var b pgx.Batch
	if wait {
		b.Queue(outboxLockSQL)
	}
	var held bool
	b.Queue(relaySQL, channel, limit).QueryRow(func(r pgx.Row) error { return r.Scan(&held, &sent) })
	if err := db.Pool.SendBatch(ctx, &b).Close(); err != nil {
		return 0, false, fmt.Errorf("relay event outbox: %w", mapErr(err))
	}
	return sent, !held, nil
}
