package joblib

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
	_ "modernc.org/sqlite" // a second SQLite connection of the test's own
)

// execOutside runs a statement on a connection of its own, outside the
// service's pool: the test uses it to break and repair the schema under a
// running sweeper.
func execOutside(t *testing.T, db *models.DB, stmt string) {
	t.Helper()
	ctx := context.Background()
	if db.Dialect() == models.Postgres {
		if _, err := db.Pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
		return
	}
	c, err := sql.Open("sqlite", db.URL()+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.ExecContext(ctx, stmt); err != nil {
		t.Fatalf("%s: %v", stmt, err)
	}
}

// A sweep that fails while this node keeps the leadership (the lock and the
// health probe answer, the sweep's own statements do not) counts as a
// database outage: once the database answers again, nothing destructive
// happens until it has been healthy for a full worker timeout.
func TestSweeperFailedSweepRearmsGuard(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		st := DefaultSettings()
		st.WorkerTimeout = 10 * time.Second
		st.SweeperInterval = time.Second
		svc := New(Config{DB: db, Settings: st})
		t.Cleanup(svc.Close)
		ctx := context.Background()
		_, alice, err := svc.CreateToken(ctx, "alice", false)
		if err != nil {
			t.Fatal(err)
		}
		newStale := func() uuid.UUID {
			w, err := svc.CreateWorker(ctx, alice)
			if err != nil {
				t.Fatal(err)
			}
			if err := db.Q(ctx).SetHeartbeatAge([]uuid.UUID{w.ID}, time.Minute); err != nil {
				t.Fatal(err)
			}
			return w.ID
		}
		exists := func(id uuid.UUID) bool {
			_, err := db.Q(ctx).GetWorker(id)
			if err != nil && err != models.ErrNotFound {
				t.Fatal(err)
			}
			return err == nil
		}

		now := time.Unix(1_000_000, 0)
		lead := &fakeLeader{held: true}
		sw := NewSweeper(svc, SweeperConfig{Leader: lead, Now: func() time.Time { return now }})
		var outcomes []string
		sw.OnSweep(func(e SweepEvent) { outcomes = append(outcomes, e.Outcome) })
		sw.healthy, sw.healthySince = true, now
		step := func(d time.Duration) string {
			t.Helper()
			now = now.Add(d)
			outcomes = nil
			sw.tick(ctx)
			if len(outcomes) != 1 {
				t.Fatalf("tick: outcomes %v", outcomes)
			}
			return outcomes[0]
		}

		// Led and healthy for a full timeout: sweeps act.
		w1 := newStale()
		if o := step(time.Second); o != SweepHeld {
			t.Fatalf("just elected: %s", o)
		}
		if o := step(10 * time.Second); o != SweepActed || exists(w1) {
			t.Fatalf("after a full timeout: %s", o)
		}

		// The sweep's statements fail; the lock and the probe still answer.
		w2 := newStale()
		execOutside(t, db, "ALTER TABLE workers RENAME TO workers_unreachable")
		o := step(time.Second)
		execOutside(t, db, "ALTER TABLE workers_unreachable RENAME TO workers")
		if o != SweepError {
			t.Fatalf("sweep against a broken database: %s", o)
		}
		if !sw.Leading() {
			t.Fatal("the failed sweep dropped leadership; this test needs it held")
		}
		if !exists(w2) {
			t.Fatal("the failed sweep removed a worker")
		}

		// The database answers again: a full timeout of health first.
		if o := step(time.Second); o != SweepHeld || !exists(w2) {
			t.Fatalf("first sweep after the failure: %s (worker kept: %v)", o, exists(w2))
		}
		if o := step(9*time.Second + 500*time.Millisecond); o != SweepHeld || !exists(w2) {
			t.Fatalf("9.5s after the failure: %s (worker kept: %v)", o, exists(w2))
		}
		if o := step(time.Second); o != SweepActed || exists(w2) {
			t.Fatalf("a full timeout after the failure: %s (worker kept: %v)", o, exists(w2))
		}
	})
}
