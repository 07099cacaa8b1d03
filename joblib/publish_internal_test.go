package joblib

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

type seen struct {
	mu    sync.Mutex
	rooms []string
	ch    chan struct{}
}

func newSeen() *seen { return &seen{ch: make(chan struct{}, 16)} }

func (s *seen) add(e events.Emission) {
	s.mu.Lock()
	s.rooms = append(s.rooms, e.Room)
	s.mu.Unlock()
	select {
	case s.ch <- struct{}{}:
	default:
	}
}

func (s *seen) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.rooms...)
}

func (s *seen) waitFor(t *testing.T, room string) []string {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		for _, r := range s.list() {
			if r == room {
				return s.list()
			}
		}
		select {
		case <-s.ch:
		case <-deadline:
			t.Fatalf("never received %s; got %v", room, s.list())
		}
	}
}

// A mutation's events reach this node's subscribers only after it commits,
// and other nodes through the outbox row its transaction writes and the relay
// sends (or, with NotifyAfterCommit, a NOTIFY right after it): a mutation
// that rolls back publishes nothing anywhere, and the one that commits is
// seen once on both nodes.
func TestMutatePublishesWithTheCommit(t *testing.T) {
	t.Parallel()
	type mode struct {
		d     models.Dialect
		after bool
	}
	for _, m := range []mode{{models.SQLite, false}, {models.Postgres, false}, {models.Postgres, true}} {
		d := m.d
		name := string(d)
		if m.after {
			name += "/notify-after-commit"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := dbtest.Open(t, d)
			var bus events.Bus = events.NewLocalBus()
			remote := newSeen()
			if d == models.Postgres {
				a := events.NewPGBus(db.Pool, "node-a", nil)
				if err := a.Start(ctx); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(a.Stop)
				other, err := models.Open(ctx, db.URL(), models.OpenOptions{})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { other.Close() })
				b := events.NewPGBus(other.Pool, "node-b", nil)
				if err := b.Start(ctx); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(b.Stop)
				b.Subscribe(remote.add)
				bus = a
			}
			local := newSeen()
			bus.Subscribe(local.add)
			st := DefaultSettings()
			st.NotifyAfterCommit = m.after
			s := New(Config{DB: db, Bus: bus, Settings: st})
			t.Cleanup(s.Close)

			boom := errors.New("boom")
			err := s.mutate(ctx, func(q *models.Q, em *events.Set) error {
				em.Add(events.Room("rolled-back"), events.JobsInvalidate{})
				return boom
			})
			if !errors.Is(err, boom) {
				t.Fatalf("mutate = %v", err)
			}
			err = s.mutate(ctx, func(q *models.Q, em *events.Set) error {
				em.Add(events.Room("committed"), events.JobsInvalidate{})
				if _, err := q.DBNow(); err != nil {
					return err
				}
				if got := local.list(); len(got) != 0 {
					t.Errorf("delivered before commit: %v", got)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			got := local.list()
			if d == models.Postgres {
				// This node delivers from the NOTIFY stream too, in the
				// order every node shares.
				got = local.waitFor(t, events.Room("committed"))
			}
			if len(got) != 1 || got[0] != events.Room("committed") {
				t.Fatalf("this node received %v", got)
			}
			if d == models.Postgres {
				// The relay sends in order: had the rolled-back mutation
				// written its row, it would be seen first.
				if got := remote.waitFor(t, events.Room("committed")); len(got) != 1 {
					t.Fatalf("the other node received %v", got)
				}
			}
		})
	}
}
