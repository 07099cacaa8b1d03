package models

import (
	"fmt"
	"time"
)

// NodeLease is the lease row of one running process (one node run). A node
// renews it on the database clock while it lives; once ExpiresAt has passed,
// the node is presumed dead and a surviving node releases the sockets it
// held.
type NodeLease struct {
	Run       string
	NodeID    string
	Addr      string
	StartedAt Time
	RenewedAt Time
	ExpiresAt Time
	// Live: ExpiresAt is in the future by the database clock.
	Live bool
}

// Stopped reports whether the lease was ended by its node's clean stop
// (ExpireNodeLease) rather than left to lapse.
func (n NodeLease) Stopped() bool { return !n.RenewedAt.Before(n.ExpiresAt.Time) }

// after returns an SQL expression for "database now plus d" and its argument.
func (q *Q) after(d time.Duration) (string, any) {
	if q.d == Postgres {
		return "(now() + ? * interval '1 microsecond')", d.Microseconds()
	}
	return "strftime('%Y-%m-%dT%H:%M:%fZ','now', ?)", fmt.Sprintf("+%.3f seconds", d.Seconds())
}

// AcquireNodeLease writes this run's lease, valid for ttl from the database's
// now, and expires at once the leases of earlier runs of the same node id:
// the caller holds the node id's session lock, so those runs are dead.
func (q *Q) AcquireNodeLease(run, nodeID, addr string, ttl time.Duration) error {
	exp, arg := q.after(ttl)
	err := q.g.Exec("INSERT INTO nodes (run, node_id, addr, started_at, renewed_at, expires_at) VALUES (?, ?, ?, "+q.now()+", "+q.now()+", "+exp+")"+
		" ON CONFLICT (run) DO UPDATE SET addr = excluded.addr, renewed_at = excluded.renewed_at, expires_at = excluded.expires_at",
		run, nodeID, addr, arg).Error
	if err != nil {
		return fmt.Errorf("acquire node lease: %w", mapErr(err))
	}
	err = q.g.Exec("UPDATE nodes SET expires_at = "+q.now()+" WHERE node_id = ? AND run <> ? AND expires_at > "+q.now(), nodeID, run).Error
	if err != nil {
		return fmt.Errorf("expire earlier runs of node %q: %w", nodeID, mapErr(err))
	}
	return nil
}

// RenewNodeLease extends this run's live lease to ttl from the database's
// now. It reports false when the lease has expired by the database's clock
// or its row is gone (another node judged this one dead and released its
// sockets): a lapsed lease is never extended, since a surviving node may be
// releasing its sockets at that moment; the node must treat its sockets as
// lost and take its lease anew (AcquireNodeLease).
func (q *Q) RenewNodeLease(run string, ttl time.Duration) (bool, error) {
	exp, arg := q.after(ttl)
	res := q.g.Exec("UPDATE nodes SET renewed_at = "+q.now()+", expires_at = "+exp+" WHERE run = ? AND expires_at > "+q.now(), arg, run)
	if res.Error != nil {
		return false, fmt.Errorf("renew node lease: %w", mapErr(res.Error))
	}
	return res.RowsAffected == 1, nil
}

// ExpireNodeLease ends this run's lease now (a graceful stop): the sockets it
// held count as closed from this moment. Its renewed_at is set to the same
// instant, which marks the lease as ended rather than lapsed (Stopped).
func (q *Q) ExpireNodeLease(run string) error {
	err := q.g.Exec("UPDATE nodes SET expires_at = "+q.now()+", renewed_at = "+q.now()+" WHERE run = ? AND expires_at > "+q.now(), run).Error
	if err != nil {
		return fmt.Errorf("expire node lease: %w", mapErr(err))
	}
	return nil
}

const nodeCols = "run, node_id, addr, started_at, renewed_at, expires_at"

// LapsedNodes returns up to limit node runs whose lease ran out more than
// grace ago by the database's clock, oldest first.
func (q *Q) LapsedNodes(grace time.Duration, limit int) ([]NodeLease, error) {
	expr, arg := q.before(grace)
	var out []NodeLease
	err := q.g.Raw("SELECT "+nodeCols+" FROM nodes WHERE expires_at < "+expr+" ORDER BY expires_at LIMIT ?", arg, limit).Scan(&out).Error
	if err != nil {
		return nil, fmt.Errorf("list lapsed nodes: %w", mapErr(err))
	}
	return out, nil
}

// DeleteLapsedNode removes a node run's lease row if it is still lapsed by
// more than grace (it was not renewed meanwhile). lead fences it to the
// sweeper leader (zero: unfenced).
func (q *Q) DeleteLapsedNode(run string, grace time.Duration, lead LeaderFence) (bool, error) {
	expr, arg := q.before(grace)
	where, args := q.andLeader("run = ? AND expires_at < "+expr, []any{run, arg}, lead)
	res := q.g.Exec("DELETE FROM nodes WHERE "+where, args...)
	if res.Error != nil {
		return false, fmt.Errorf("delete lapsed node: %w", mapErr(res.Error))
	}
	return res.RowsAffected == 1, nil
}

// ListNodes returns every lease row, newest start first, with Live set by
// the database's clock.
func (q *Q) ListNodes() ([]NodeLease, error) {
	var out []NodeLease
	err := q.g.Raw("SELECT " + nodeCols + ", (expires_at > " + q.now() + ") AS live FROM nodes ORDER BY started_at DESC, run").Scan(&out).Error
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", mapErr(err))
	}
	return out, nil
}

// LiveNode returns the live lease of a node run, or ErrNotFound.
func (q *Q) LiveNode(run string) (NodeLease, error) {
	var out []NodeLease
	err := q.g.Raw("SELECT "+nodeCols+", true AS live FROM nodes WHERE run = ? AND expires_at > "+q.now(), run).Scan(&out).Error
	if err != nil {
		return NodeLease{}, fmt.Errorf("read node lease: %w", mapErr(err))
	}
	if len(out) == 0 {
		return NodeLease{}, ErrNotFound
	}
	return out[0], nil
}

// DeleteNodeLease removes a node run's lease row whatever its state.
func (q *Q) DeleteNodeLease(run string) error {
	if err := q.g.Exec("DELETE FROM nodes WHERE run = ?", run).Error; err != nil {
		return fmt.Errorf("delete node lease: %w", mapErr(err))
	}
	return nil
}
