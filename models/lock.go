package models

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// SessionLock is a named lock held by one process at a time for as long as
// it keeps a database session: on PostgreSQL a session-level advisory lock on
// a connection taken out of the pool for that purpose, so the lock dies with
// the session when the process does. The name is scoped to the current
// schema, so deployments (and tests) that share a database in different
// schemas do not contend. On SQLite, a single-process database, Hold always
// succeeds. A SessionLock is not safe for concurrent use.
type SessionLock struct {
	db   *DB
	name string
	conn *pgxpool.Conn
}

// NewSessionLock returns an unheld lock named name.
func (db *DB) NewSessionLock(name string) *SessionLock {
	return &SessionLock{db: db, name: name}
}

// Hold takes the lock if it is free, or checks that the session still holds
// it, and reports whether this process holds it now. An error means the
// database could not be asked; the lock is then considered lost (the
// session, and with it the lock, may be gone).
func (l *SessionLock) Hold(ctx context.Context) (bool, error) {
	if l.db.dialect != Postgres {
		return true, nil
	}
	if l.conn != nil {
		var one int
		if err := l.conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
			l.drop()
			return false, fmt.Errorf("check lock %q: %w", l.name, err)
		}
		return true, nil
	}
	conn, err := l.db.Pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("acquire connection for lock %q: %w", l.name, err)
	}
	var got bool
	err = conn.QueryRow(ctx, "SELECT pg_try_advisory_lock(hashtext($1), hashtext(current_schema()))", "joblib:"+l.name).Scan(&got)
	if err != nil {
		conn.Release()
		return false, fmt.Errorf("take lock %q: %w", l.name, err)
	}
	if !got {
		conn.Release()
		return false, nil
	}
	l.conn = conn
	return true, nil
}

// Held reports whether the last Hold succeeded and the lock was not released.
func (l *SessionLock) Held() bool { return l.db.dialect != Postgres || l.conn != nil }

// Release gives the lock up by closing its session (which frees the lock even
// if the unlock could not be sent). Safe to call when not held. A held lock
// keeps a pool connection: release it before DB.Close, which waits for it.
func (l *SessionLock) Release() { l.drop() }

func (l *SessionLock) drop() {
	if l.conn == nil {
		return
	}
	c := l.conn.Hijack()
	l.conn = nil
	// Unlock first so the next holder need not wait for the backend to
	// exit; closing the session releases the lock anyway if the unlock
	// cannot be sent. A dead network must not hang the caller.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = c.Exec(ctx, "SELECT pg_advisory_unlock_all()")
	_ = c.Close(ctx)
}

// ErrLockHeld means another process holds a SessionLock.
var ErrLockHeld = errors.New("lock held by another process")
