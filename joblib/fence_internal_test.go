package joblib

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/internal/syncbuf"
	"github.com/zndraw/joblib/models"
)

// Leadership is a lease row: one holder at a time, renewed under the same
// epoch, taken over under a new epoch once it expired. A leader that stalled
// past its lease and woke after the take-over writes nothing: its node
// reaping, sweep cleanups and retention carry its old epoch and match no
// row, while the new leader's act.
func TestLeaderLeaseFencesAStaleLeader(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		svc := New(Config{DB: db})
		t.Cleanup(svc.Close)
		ctx := context.Background()
		q := db.Q(ctx)
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		hold := func(l *models.LeaderLease, want bool) LeaderFence {
			t.Helper()
			f, ok, err := l.Hold(ctx)
			if err != nil || ok != want {
				t.Fatalf("hold: %v %v, want held %v", ok, err, want)
			}
			return f
		}
		const ttl = 300 * time.Millisecond
		a := db.NewLeaderLease("sweeper", "run-a", ttl)
		b := db.NewLeaderLease("sweeper", "run-b", time.Minute)
		fa := hold(a, true)
		if again := hold(a, true); again != fa || fa.Epoch != 1 {
			t.Fatalf("renewal changed the fence: %+v then %+v", fa, again)
		}
		hold(b, false) // held by a
		time.Sleep(ttl + 100*time.Millisecond)
		fb := hold(b, true) // a stalled past its lease: b takes over
		if fb.Epoch != fa.Epoch+1 {
			t.Fatalf("take-over epoch %d after %d", fb.Epoch, fa.Epoch)
		}
		hold(a, false) // a wakes: not the leader

		_, alice, err := svc.CreateToken(ctx, "alice", false)
		must(err)
		newWorker := func() uuid.UUID {
			w, err := svc.CreateWorker(ctx, alice)
			must(err)
			return w.ID
		}
		stale := newWorker()
		must(q.SetHeartbeatAge([]uuid.UUID{stale}, time.Hour))
		lost := newWorker()
		must(q.AcquireNodeLease("dead-run", "dead", "", time.Minute))
		_, err = q.BindWorker(lost, "dead", "dead-run")
		must(err)
		must(q.ExpireNodeLease("dead-run"))
		_, _, err = svc.RegisterJob(ctx, alice, "r", RegisterJobParams{Category: "modifiers", Name: "a", WorkerID: &lost})
		must(err)
		tk, err := svc.SubmitTask(ctx, alice, "r", "r:modifiers:a", nil)
		must(err)
		_, err = svc.UpdateTask(ctx, alice, tk.ID, models.StatusCancelled, nil)
		must(err)
		must(q.SetTaskCompletedAge([]uuid.UUID{tk.ID}, 2*time.Hour))
		// A live worker's task past its task_timeout: stuck, for the sweep's
		// timeout step.
		holder := newWorker()
		limit := 60
		_, _, err = svc.RegisterJob(ctx, alice, "r", RegisterJobParams{Category: "modifiers", Name: "slow", WorkerID: &holder, TaskTimeout: &limit})
		must(err)
		stuck, err := svc.SubmitTask(ctx, alice, "r", "r:modifiers:slow", nil)
		must(err)
		claimed, err := svc.ClaimTask(ctx, alice, holder)
		must(err)
		if claimed == nil || claimed.ID != stuck.ID {
			t.Fatalf("claimed %v, want the stuck task", claimed)
		}
		must(q.SetTaskClaimAge([]uuid.UUID{stuck.ID}, 2*time.Minute))
		status := func() string {
			t.Helper()
			tk, err := q.GetTask(stuck.ID)
			must(err)
			return string(tk.Status)
		}
		svc.settings.TaskRetentionCompleted = time.Hour
		time.Sleep(5 * time.Millisecond)
		exists := func(id uuid.UUID) bool {
			_, err := q.GetWorker(id)
			return err == nil
		}

		// The woken former leader.
		rep, err := svc.Sweep(ctx, SweepParams{Threshold: time.Minute, Leader: fa})
		must(err)
		reap, err := svc.ReapLostNodes(ctx, 0, fa)
		must(err)
		pruned, err := svc.prune(ctx, false, fa)
		must(err)
		if rep.Result.Cleaned != 0 || reap.Result.Cleaned != 0 || len(reap.Nodes) != 0 || pruned.Total() != 0 || !exists(stale) || !exists(lost) {
			t.Fatalf("a stale leader acted: swept %d, reaped %d (nodes %d), pruned %d", rep.Result.Cleaned, reap.Result.Cleaned, len(reap.Nodes), pruned.Total())
		}
		if _, err := q.GetTask(tk.ID); err != nil {
			t.Fatalf("a stale leader pruned a task: %v", err)
		}
		if len(rep.TimedOut) != 0 || status() != "claimed" {
			t.Fatalf("a stale leader timed out %d task(s); the stuck task is %s", len(rep.TimedOut), status())
		}
		// The leader.
		rep, err = svc.Sweep(ctx, SweepParams{Threshold: time.Minute, Leader: fb})
		must(err)
		reap, err = svc.ReapLostNodes(ctx, 0, fb)
		must(err)
		pruned, err = svc.prune(ctx, false, fb)
		must(err)
		if rep.Result.Cleaned != 1 || reap.Result.Cleaned != 1 || len(reap.Nodes) != 1 || pruned.Total() != 1 || exists(stale) || exists(lost) {
			t.Fatalf("the leader: swept %d, reaped %d (nodes %d), pruned %d", rep.Result.Cleaned, reap.Result.Cleaned, len(reap.Nodes), pruned.Total())
		}
		if len(rep.TimedOut) != 1 || status() != "failed" {
			t.Fatalf("the leader timed out %d task(s); the stuck task is %s", len(rep.TimedOut), status())
		}

		// Release hands over at once, under a new epoch; a holder whose own
		// lease lapsed takes it back under a new epoch too.
		b.Release()
		c := db.NewLeaderLease("sweeper", "run-c", ttl)
		fc := hold(c, true)
		if fc.Epoch != fb.Epoch+1 {
			t.Fatalf("epoch after a release: %d after %d", fc.Epoch, fb.Epoch)
		}
		time.Sleep(ttl + 100*time.Millisecond)
		if f := hold(c, true); f.Epoch != fc.Epoch+1 {
			t.Fatalf("re-take after a stall kept epoch %d (was %d)", f.Epoch, fc.Epoch)
		}
		row, err := q.GetLeaderLease("sweeper")
		if err != nil || row.Holder != "run-c" || !row.Live || row.Epoch != fc.Epoch+1 {
			t.Fatalf("lease row %+v %v", row, err)
		}
	})
}

// The node lease is the stall detector. A pause shorter than the lease
// changes nothing. Past it, by the process's clock, the lease no longer
// counts as valid: an action that arrives waits (AwaitNodeLease) until a
// renewal has asked the database; the database says the lease lapsed, so the
// node drops its sockets (OnLost) before a new lease lets anything act, the
// waiting action is refused, and the stall is logged at WARN with its length.
func TestLeaseStallHoldsActionsBack(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		svc := New(Config{DB: db})
		t.Cleanup(svc.Close)
		ctx := context.Background()
		var mu sync.Mutex
		var skew time.Duration
		jump := func(d time.Duration) { mu.Lock(); skew = d; mu.Unlock() }
		now := func() time.Time { mu.Lock(); defer mu.Unlock(); return time.Now().Add(skew) }
		var logs syncbuf.Buffer
		var lost atomic.Int32
		l := svc.NewLease(LeaseConfig{Timeout: time.Minute, Now: now, Logger: slog.New(slog.NewTextHandler(&logs, nil)), OnLost: func() {
			if svc.NodeLeaseValid() {
				t.Error("sockets dropped while the lapsed lease still counted as valid")
			}
			lost.Add(1)
		}})
		n := svc.Node()
		sent := now()
		if err := db.Q(ctx).AcquireNodeLease(n.Run, n.ID, "", time.Minute); err != nil {
			t.Fatal(err)
		}
		l.renewed(sent, false)
		st := &leaseLoop{every: 20 * time.Second, lastOK: sent, lastWake: sent}
		if !svc.NodeLeaseValid() {
			t.Fatal("a fresh lease is not valid")
		}

		// Paused for half the lease: the renewal holds, nothing happens.
		jump(30 * time.Second)
		l.tick(ctx, st)
		if lost.Load() != 0 || !svc.NodeLeaseValid() || strings.Contains(logs.String(), "stalled") {
			t.Fatalf("a pause shorter than the lease: lost %d, valid %v\n%s", lost.Load(), svc.NodeLeaseValid(), logs.String())
		}

		// Paused past the lease; by the database's clock the lease lapsed.
		if err := db.Q(ctx).ExpireNodeLease(n.Run); err != nil {
			t.Fatal(err)
		}
		jump(2*time.Minute + 30*time.Second)
		if svc.NodeLeaseValid() {
			t.Fatal("the lease counts as valid after a stall, before a renewal asked the database")
		}
		done := make(chan error, 1)
		go func() { done <- svc.AwaitNodeLease(ctx) }()
		select {
		case err := <-done:
			t.Fatalf("an action went ahead after the stall before the lease was checked: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		l.tick(ctx, st)
		select {
		case err := <-done:
			if !errors.Is(err, ErrNodeLeaseLost) {
				t.Fatalf("the waiting action: %v, want ErrNodeLeaseLost", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the waiting action was never answered")
		}
		if lost.Load() != 1 || !svc.NodeLeaseValid() {
			t.Fatalf("after the check: sockets dropped %d times, valid %v", lost.Load(), svc.NodeLeaseValid())
		}
		if _, err := db.Q(ctx).LiveNode(n.Run); err != nil {
			t.Fatalf("no new lease after the loss: %v", err)
		}
		out := logs.String()
		if !strings.Contains(out, `level=WARN msg="this node stalled longer than its lease; asking the database before it acts"`) || !strings.Contains(out, "stalled_for=1m40") { // 2 min since the last tick, less the 20 s period
			t.Fatalf("the stall is not logged at WARN with its length:\n%s", out)
		}
		if err := svc.AwaitNodeLease(ctx); err != nil {
			t.Fatalf("an action after the new lease: %v", err)
		}
	})
}

// A node's keep-alive is fenced by its lease: once the lease lapsed by the
// database's clock, the node refreshes nobody's heartbeat (a survivor may be
// releasing those workers), and it never refreshes a worker bound to another
// run since; a lapsed lease is never renewed either.
func TestLapsedNodeLeaseFencesKeepAlive(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		svc := New(Config{DB: db})
		t.Cleanup(svc.Close)
		ctx := context.Background()
		q := db.Q(ctx)
		_, alice, err := svc.CreateToken(ctx, "alice", false)
		if err != nil {
			t.Fatal(err)
		}
		n := svc.Node()
		if err := q.AcquireNodeLease(n.Run, n.ID, "", time.Minute); err != nil {
			t.Fatal(err)
		}
		var ids []uuid.UUID
		for range 2 {
			w, err := svc.CreateWorker(ctx, alice)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := svc.BindWorker(ctx, w.ID); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, w.ID)
		}
		if _, err := q.BindWorker(ids[1], "other", "other-run"); err != nil { // re-joined elsewhere
			t.Fatal(err)
		}
		// keepAlive ages both heartbeats by an hour, runs a keep-alive and
		// returns how many are still stale.
		keepAlive := func() int64 {
			t.Helper()
			if err := q.SetHeartbeatAge(ids, time.Hour); err != nil {
				t.Fatal(err)
			}
			gone, err := svc.KeepAlive(ctx, ids)
			if err != nil || len(gone) != 0 {
				t.Fatalf("keep-alive: %v %v (no worker is gone)", gone, err)
			}
			stale, _, err := q.CountWorkers(time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			return stale
		}
		if stale := keepAlive(); stale != 1 {
			t.Fatalf("keep-alive under a live lease: %d stale, want 1 (only the worker bound elsewhere)", stale)
		}
		if err := q.ExpireNodeLease(n.Run); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
		if stale := keepAlive(); stale != 2 {
			t.Fatalf("keep-alive after the lease lapsed: %d stale, want 2", stale)
		}
		if ok, err := q.RenewNodeLease(n.Run, time.Minute); ok || err != nil {
			t.Fatalf("a lapsed lease was renewed: %v %v", ok, err)
		}
	})
}
