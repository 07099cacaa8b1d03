package server

// Connection state recovery: where disconnected sockets' sessions are
// kept and how long.

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server/sio"
)

// wantsOffsets reports whether a connecting client asked for connection
// state recovery with "recover": true in its CONNECT auth. Only those get
// the trailing offset argument: a python-socketio handler written as
// `def on_event(data)` fails on an extra argument, and a UI that does not
// look at socket.recovered refetches after every reconnection anyway.
func wantsOffsets(auth json.RawMessage) bool {
	var a struct {
		Recover bool `json:"recover"`
	}
	return len(auth) > 0 && json.Unmarshal(auth, &a) == nil && a.Recover
}

// socketOwner names who a socket belongs to, for connection state recovery:
// a session is restored only to the same user (or to another anonymous
// reader).
func socketOwner(s *sio.Socket) string {
	st, _ := s.Data().(*connState)
	switch {
	case st == nil:
		return ""
	case st.anon:
		return "anonymous"
	}
	return st.p.ID.String()
}

// sessionStore is where disconnected sockets' sessions are kept: the
// database on PostgreSQL (any node may recover them), else memory.
// sessionStore keeps the sessions of disconnected sockets in PostgreSQL when
// the bus is PostgreSQL's, whose NOTIFY queue gives every node one order of
// delivery, so that an offset means the same on every node. With another bus
// (NATS orders each publisher's messages, not their interleaving) or on
// SQLite, sessions stay in the node's memory: a client recovers on the node
// it was on, and elsewhere gets a fresh session, never a wrong replay.
func sessionStore(db *models.DB, bus events.Bus) sio.SessionStore {
	if events.DeliversInOneOrder(bus) && db != nil && db.Caps().SharedSessions {
		return dbSessionStore{db}
	}
	return nil
}

type dbSessionStore struct{ db *models.DB }

func (d dbSessionStore) Save(ctx context.Context, s sio.Session, ttl time.Duration) error {
	rooms, err := json.Marshal(s.Rooms)
	if err != nil {
		return err
	}
	return d.db.SaveSocketSession(ctx, models.SocketSession{PID: s.PID, SID: s.SID, Rooms: string(rooms), Owner: s.Owner}, ttl)
}

func (d dbSessionStore) Take(ctx context.Context, pid string) (sio.Session, bool, error) {
	ms, ok, err := d.db.TakeSocketSession(ctx, pid)
	if err != nil || !ok {
		return sio.Session{}, false, err
	}
	s := sio.Session{PID: ms.PID, SID: ms.SID, Owner: ms.Owner}
	if err := json.Unmarshal([]byte(ms.Rooms), &s.Rooms); err != nil {
		return sio.Session{}, false, fmt.Errorf("read socket session rooms: %w", err)
	}
	return s, true, nil
}

// purgeRecovery drops the recorded room events past the recovery window and
// deletes expired socket sessions from the database (PostgreSQL) every
// quarter window (at most every 30 s), whether or not anything happens
// meanwhile: an idle node lets go of them.
func (rt *Realtime) purgeRecovery() {
	t := time.NewTicker(min(rt.cfg.RecoveryWindow/4, 30*time.Second))
	defer t.Stop()
	for {
		select {
		case <-rt.stop:
			return
		case <-t.C:
		}
		rt.io.Namespace("/").TrimHistory()
		if !rt.svc.DB().Caps().SharedSessions {
			continue
		}
		ctx, cancel := rt.writeBudget(rt.ctx)
		_, err := rt.svc.DB().PurgeSocketSessions(ctx)
		cancel()
		if err != nil && rt.ctx.Err() == nil {
			rt.log.Warn("purge socket sessions", "err", err)
		}
	}
}
