package models

import (
	"context"
	"fmt"
	"time"
)

// LeaderFence is the proof of leadership a leader's writes carry: the name
// of the leadership lease and the epoch this process holds. A statement
// fenced by it matches nothing unless that lease row still has this epoch
// and has not expired by the database's clock, so a leader that was paused
// (SIGSTOP, a frozen VM) and woke after another node took over writes
// nothing. The zero value fences nothing: operator commands (joblib sweep
// --fix, joblib tasks prune) act on an operator's word, not a leader's.
type LeaderFence struct {
	Name  string
	Epoch int64
}

// Zero reports whether the fence is the zero value (unfenced).
func (f LeaderFence) Zero() bool { return f.Epoch == 0 }

// leaderCond returns the SQL condition of a leader fence (empty for the zero
// fence) and its arguments. The database's statement time is compared, not
// the transaction's start, so a transaction that stalled before this
// statement is judged when the statement runs.
func (q *Q) leaderCond(f LeaderFence) (string, []any) {
	if f.Zero() {
		return "", nil
	}
	clock := "statement_timestamp()"
	if q.d != Postgres {
		clock = sqliteNow
	}
	return "EXISTS (SELECT 1 FROM leases ll WHERE ll.name = ? AND ll.epoch = ? AND ll.expires_at > " + clock + ")", []any{f.Name, f.Epoch}
}

// andLeader appends the fence's condition to a WHERE clause with its
// arguments.
func (q *Q) andLeader(where string, args []any, f LeaderFence) (string, []any) {
	cond, cargs := q.leaderCond(f)
	if cond == "" {
		return where, args
	}
	return where + " AND " + cond, append(args, cargs...)
}

// LeaderLease is leadership as a lease row on the database clock: one row
// per name, held by one holder (a node run) until expires_at, renewed by
// the holder, taken by anyone once it has expired. Each hand-over, and each
// re-take by a holder whose own lease had lapsed (it stalled), moves the
// epoch on; writes fenced by an older epoch match nothing. Nothing about it
// lives in a database session, so a paused process loses it on time
// although its connections stay open. The same statements run on SQLite
// (one node: the holder keeps it, and a stall still moves the epoch on).
// A LeaderLease is not safe for concurrent use.
type LeaderLease struct {
	db     *DB
	name   string
	holder string
	ttl    time.Duration
	epoch  int64
}

// NewLeaderLease returns the lease name as holder would hold it, valid for
// ttl after each renewal.
func (db *DB) NewLeaderLease(name, holder string, ttl time.Duration) *LeaderLease {
	return &LeaderLease{db: db, name: name, holder: holder, ttl: ttl}
}

// Hold takes the lease if it is free or expired, or renews it if this
// holder holds it and it has not expired, in one statement; it reports
// whether this holder leads now and with which fence. An error means the
// database could not be asked: the caller must act as a follower.
func (l *LeaderLease) Hold(ctx context.Context) (LeaderFence, bool, error) {
	q := l.db.Q(ctx)
	exp, arg := q.after(l.ttl)
	now := q.now()
	// live: the row is this holder's and has not expired. Renewing keeps the
	// epoch; anything else (a take-over, or a re-take after this holder's
	// own lease lapsed) starts a new one.
	live := "leases.holder = excluded.holder AND leases.expires_at > " + now
	var rows []struct{ Epoch int64 }
	err := q.g.Raw("INSERT INTO leases (name, holder, epoch, acquired_at, renewed_at, expires_at) VALUES (?, ?, 1, "+now+", "+now+", "+exp+")"+
		" ON CONFLICT (name) DO UPDATE SET holder = excluded.holder,"+
		" epoch = CASE WHEN "+live+" THEN leases.epoch ELSE leases.epoch + 1 END,"+
		" acquired_at = CASE WHEN "+live+" THEN leases.acquired_at ELSE excluded.acquired_at END,"+
		" renewed_at = excluded.renewed_at, expires_at = excluded.expires_at"+
		" WHERE leases.holder = excluded.holder OR leases.expires_at <= "+now+
		" RETURNING epoch", l.name, l.holder, arg).Scan(&rows).Error
	if err != nil {
		l.epoch = 0
		return LeaderFence{}, false, fmt.Errorf("hold leader lease %q: %w", l.name, mapErr(err))
	}
	if len(rows) == 0 {
		l.epoch = 0
		return LeaderFence{}, false, nil
	}
	l.epoch = rows[0].Epoch
	return LeaderFence{Name: l.name, Epoch: l.epoch}, true, nil
}

// Release ends the lease now if this holder still holds it with the epoch
// of its last Hold, so that another node need not wait for it to expire.
func (l *LeaderLease) Release() {
	if l.epoch == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	q := l.db.Q(ctx)
	_ = q.g.Exec("UPDATE leases SET expires_at = "+q.now()+" WHERE name = ? AND holder = ? AND epoch = ? AND expires_at > "+q.now(),
		l.name, l.holder, l.epoch).Error
	l.epoch = 0
}

// LeaderLeaseRow is a leadership lease as stored.
type LeaderLeaseRow struct {
	Name       string
	Holder     string
	Epoch      int64
	AcquiredAt Time
	RenewedAt  Time
	ExpiresAt  Time
	// Live: ExpiresAt is in the future by the database clock.
	Live bool
}

// GetLeaderLease reads a leadership lease, or ErrNotFound.
func (q *Q) GetLeaderLease(name string) (LeaderLeaseRow, error) {
	var out []LeaderLeaseRow
	err := q.g.Raw("SELECT name, holder, epoch, acquired_at, renewed_at, expires_at, (expires_at > "+q.now()+") AS live FROM leases WHERE name = ?", name).Scan(&out).Error
	if err != nil {
		return LeaderLeaseRow{}, fmt.Errorf("read leader lease: %w", mapErr(err))
	}
	if len(out) == 0 {
		return LeaderLeaseRow{}, ErrNotFound
	}
	return out[0], nil
}
