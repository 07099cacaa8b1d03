package joblib

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// fakeLeader is a Leader the test steers. Its fence is the zero one
// (unfenced statements).
type fakeLeader struct {
	mu   sync.Mutex
	held bool
	err  error
}

func (f *fakeLeader) Hold(context.Context) (LeaderFence, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return LeaderFence{}, f.held && f.err == nil, f.err
}

func (f *fakeLeader) Release() {}

func (f *fakeLeader) set(held bool, err error) {
	f.mu.Lock()
	f.held, f.err = held, err
	f.mu.Unlock()
}

// The guards, driven tick by tick on an injected clock: no destructive sweep
// until the node has led for one worker timeout, none during a database
// outage, and none until the database has been healthy again for one full
// worker timeout.
func TestSweeperGuards(t *testing.T) {
	t.Parallel()
	db := dbtest.Open(t, models.SQLite)
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
		return err == nil
	}

	now := time.Unix(1_000_000, 0)
	lead := &fakeLeader{}
	sw := NewSweeper(svc, SweeperConfig{Leader: lead, Now: func() time.Time { return now }})
	var outcomes []string
	sw.OnSweep(func(e SweepEvent) { outcomes = append(outcomes, e.Outcome) })
	sw.healthy, sw.healthySince = true, now
	step := func(d time.Duration) string {
		now = now.Add(d)
		outcomes = nil
		sw.tick(ctx)
		if len(outcomes) != 1 {
			t.Fatalf("tick at +%s: outcomes %v", d, outcomes)
		}
		return outcomes[0]
	}

	w1 := newStale()
	if o := step(0); o != SweepFollower {
		t.Fatalf("not leader: %s", o)
	}
	lead.set(true, nil)
	if o := step(time.Second); o != SweepHeld || !exists(w1) {
		t.Fatalf("just elected: %s", o)
	}
	if o := step(9 * time.Second); o != SweepHeld || !exists(w1) {
		t.Fatalf("led 9s of a 10s timeout: %s", o)
	}
	if o := step(time.Second); o != SweepActed || exists(w1) {
		t.Fatalf("led a full timeout: %s, worker exists %v", o, exists(w1))
	}

	// Outage: the database cannot be asked; then it is back.
	w2 := newStale()
	lead.set(true, errors.New("connection refused"))
	if o := step(time.Second); o != SweepError || !exists(w2) {
		t.Fatalf("during outage: %s", o)
	}
	if sw.Leading() {
		t.Fatal("still leading while the database is unreachable")
	}
	lead.set(true, nil)
	if o := step(time.Second); o != SweepHeld || !exists(w2) {
		t.Fatalf("right after the outage: %s", o)
	}
	if o := step(9*time.Second + 500*time.Millisecond); o != SweepHeld || !exists(w2) {
		t.Fatalf("9.5s after the outage: %s", o)
	}
	if o := step(time.Second); o != SweepActed || exists(w2) {
		t.Fatalf("a full timeout after the outage: %s", o)
	}
	if o := step(time.Second); o != SweepIdle {
		t.Fatalf("nothing stale: %s", o)
	}
	// Ticks between intervals do not sweep.
	outcomes = nil
	now = now.Add(100 * time.Millisecond)
	sw.tick(ctx)
	if len(outcomes) != 0 {
		t.Fatalf("swept before the interval was due: %v", outcomes)
	}
}

// Start/Stop follow the service contract, also when called concurrently.
func TestSweeperStartStop(t *testing.T) {
	t.Parallel()
	db := dbtest.Open(t, models.SQLite)
	svc := New(Config{DB: db})
	t.Cleanup(svc.Close)
	sw := NewSweeper(svc, SweeperConfig{Leader: &fakeLeader{held: true}})
	ctx := context.Background()
	for range 3 {
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				if err := sw.Start(ctx); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		select {
		case <-sw.Started():
		case <-time.After(5 * time.Second):
			t.Fatal("not started")
		}
		for range 4 {
			wg.Go(sw.Stop)
		}
		wg.Wait()
		select {
		case <-sw.Stopped():
		default:
			t.Fatal("Stop returned before the sweeper stopped")
		}
	}
	sw.Stop() // idempotent when stopped
}

// On PostgreSQL one node at a time holds the sweeper lock, in its own schema.
func TestSweeperLockIsExclusive(t *testing.T) {
	t.Parallel()
	db := dbtest.Open(t, models.Postgres)
	ctx := context.Background()
	a, b := db.NewSessionLock("sweeper"), db.NewSessionLock("sweeper")
	if ok, err := a.Hold(ctx); !ok || err != nil {
		t.Fatalf("first holder: %v %v", ok, err)
	}
	if ok, err := b.Hold(ctx); ok || err != nil {
		t.Fatalf("second holder: %v %v", ok, err)
	}
	if ok, err := a.Hold(ctx); !ok || err != nil {
		t.Fatalf("holder re-check: %v %v", ok, err)
	}
	other := dbtest.Open(t, models.Postgres) // another schema: its own lock
	ol := other.NewSessionLock("sweeper")
	if ok, err := ol.Hold(ctx); !ok || err != nil {
		t.Fatalf("other schema: %v %v", ok, err)
	}
	ol.Release()
	a.Release()
	if ok, err := b.Hold(ctx); !ok || err != nil {
		t.Fatalf("after release: %v %v", ok, err)
	}
	b.Release()
}

// Node loss is acted on at every probe, but only after the leader has led
// with a healthy database for one lease timeout: a database outage lapses
// every lease, and live nodes need that long to renew theirs.
func TestSweeperReapsLostNodesAfterGuard(t *testing.T) {
	t.Parallel()
	db := dbtest.Open(t, models.SQLite)
	st := DefaultSettings()
	st.WorkerTimeout = time.Hour
	st.SweeperInterval = time.Hour
	st.NodeLeaseTimeout = 10 * time.Second
	svc := New(Config{DB: db, Settings: st})
	t.Cleanup(svc.Close)
	ctx := context.Background()
	_, alice, err := svc.CreateToken(ctx, "alice", false)
	if err != nil {
		t.Fatal(err)
	}
	q := db.Q(ctx)
	lostWorker := func(run string) uuid.UUID {
		w, err := svc.CreateWorker(ctx, alice)
		if err != nil {
			t.Fatal(err)
		}
		if err := q.AcquireNodeLease(run, "node-"+run, "", time.Minute); err != nil {
			t.Fatal(err)
		}
		if _, err := q.BindWorker(w.ID, "node-"+run, run); err != nil {
			t.Fatal(err)
		}
		if err := q.ExpireNodeLease(run); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
		return w.ID
	}
	exists := func(id uuid.UUID) bool {
		_, err := q.GetWorker(id)
		return err == nil
	}
	now := time.Unix(1_000_000, 0)
	lead := &fakeLeader{}
	sw := NewSweeper(svc, SweeperConfig{Leader: lead, Now: func() time.Time { return now }})
	sw.healthy, sw.healthySince = true, now
	step := func(d time.Duration) { now = now.Add(d); sw.tick(ctx) }

	w1 := lostWorker("r1")
	step(0)
	if !exists(w1) {
		t.Fatal("a follower released a lost node")
	}
	lead.set(true, nil)
	step(time.Second) // elected now
	step(9 * time.Second)
	if !exists(w1) {
		t.Fatal("released a lost node 9s into a 10s lease timeout of leadership")
	}
	step(time.Second)
	if exists(w1) {
		t.Fatal("lost node not released after one lease timeout of leadership")
	}

	w2 := lostWorker("r2")
	lead.set(true, errors.New("connection refused"))
	step(time.Second)
	lead.set(true, nil)
	step(time.Second) // healthy again now
	step(9 * time.Second)
	if !exists(w2) {
		t.Fatal("released a node within one lease timeout after a database outage")
	}
	step(time.Second)
	if exists(w2) {
		t.Fatal("lost node not released one lease timeout after the outage")
	}
}
