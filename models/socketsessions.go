package models

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// SocketSession is a disconnected Socket.IO client's session, kept for
// connection state recovery (PostgreSQL only: see migration 70).
type SocketSession struct {
	PID, SID, Rooms, Owner string // Rooms: a JSON array
}

// SaveSocketSession keeps s until ttl from now by the database clock,
// replacing a session of the same pid.
func (db *DB) SaveSocketSession(ctx context.Context, s SocketSession, ttl time.Duration) error {
	if db.Pool == nil {
		return ErrNoHotPath
	}
	_, err := db.Pool.Exec(ctx, `INSERT INTO socket_sessions (pid, sid, rooms, owner, expires_at)
 VALUES ($1, $2, $3, $4, now() + $5 * interval '1 millisecond')
 ON CONFLICT (pid) DO UPDATE SET sid = excluded.sid, rooms = excluded.rooms, owner = excluded.owner, expires_at = excluded.expires_at`,
		s.PID, s.SID, s.Rooms, s.Owner, ttl.Milliseconds())
	if err != nil {
		return fmt.Errorf("save socket session: %w", mapErr(err))
	}
	return nil
}

// TakeSocketSession removes the session of pid and returns it if it had not
// expired by the database clock.
func (db *DB) TakeSocketSession(ctx context.Context, pid string) (SocketSession, bool, error) {
	if db.Pool == nil {
		return SocketSession{}, false, ErrNoHotPath
	}
	s := SocketSession{PID: pid}
	var live bool
	err := db.Pool.QueryRow(ctx, `DELETE FROM socket_sessions WHERE pid = $1 RETURNING sid, rooms, owner, expires_at > now()`, pid).
		Scan(&s.SID, &s.Rooms, &s.Owner, &live)
	if errors.Is(err, pgx.ErrNoRows) {
		return SocketSession{}, false, nil
	}
	if err != nil {
		return SocketSession{}, false, fmt.Errorf("take socket session: %w", mapErr(err))
	}
	return s, live, nil
}

// PurgeSocketSessions deletes the sessions that expired by the database
// clock and returns how many.
func (db *DB) PurgeSocketSessions(ctx context.Context) (int64, error) {
	if db.Pool == nil {
		return 0, ErrNoHotPath
	}
	tag, err := db.Pool.Exec(ctx, `DELETE FROM socket_sessions WHERE expires_at <= now()`)
	if err != nil {
		return 0, fmt.Errorf("purge socket sessions: %w", mapErr(err))
	}
	return tag.RowsAffected(), nil
}
