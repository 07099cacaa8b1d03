package server_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// graceWatch is a log handler for a node's Socket.IO side that tells when a
// disconnect grace has run out and its cleanup found the worker re-bound.
type graceWatch struct {
	mu   sync.Mutex
	kept map[string]bool
	wake chan struct{}
}

// keptMessage is what the realtime side logs when a disconnect cleanup finds
// that the worker re-joined within the grace window.
const keptMessage = "worker re-attached within grace; kept"

func newGraceWatch() *graceWatch {
	return &graceWatch{kept: map[string]bool{}, wake: make(chan struct{}, 1)}
}

func (g *graceWatch) Enabled(context.Context, slog.Level) bool { return true }
func (g *graceWatch) WithAttrs([]slog.Attr) slog.Handler       { return g }
func (g *graceWatch) WithGroup(string) slog.Handler            { return g }
func (g *graceWatch) Handle(_ context.Context, r slog.Record) error {
	if r.Message != keptMessage {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "worker" {
			g.mu.Lock()
			g.kept[a.Value.String()] = true
			g.mu.Unlock()
			select {
			case g.wake <- struct{}{}:
			default:
			}
		}
		return true
	})
	return nil
}

// waitExpired waits until the grace timer of the worker's old socket has
// fired and its cleanup ran, or until the worker is gone (a wrongly acting
// cleanup logs nothing here).
func (g *graceWatch) waitExpired(t *testing.T, e *env, wid string, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for {
		g.mu.Lock()
		done := g.kept[wid]
		g.mu.Unlock()
		if done {
			return
		}
		if e.do(e.alice, "PATCH", api+"/workers/"+wid, nil).Status == 404 {
			return
		}
		select {
		case <-g.wake:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("the old socket's grace cleanup did not run within %s", within)
		}
	}
}

func withRealtimeLog(h slog.Handler) func(*setupOpts) {
	return func(o *setupOpts) { o.realtimeLog = slog.New(h) }
}

// assertKept checks that the worker survived its old socket's grace cleanup
// with its claim, its audit trail empty and no loss published to its room.
// (Only the room's emissions count: on PostgreSQL the NOTIFY channel is
// shared by every test running against the same database.)
func assertKept(t *testing.T, e *env, room, wid, taskID string, since []events.Emission) {
	t.Helper()
	e.do(e.alice, "PATCH", api+"/workers/"+wid, nil).want(200)
	if st := e.getTask(taskID)["status"]; st != "claimed" {
		t.Fatalf("task is %v after the old socket's grace ran out, want claimed", st)
	}
	id := uuid.MustParse(wid)
	es, err := e.db.Q(context.Background()).ListCleanupEvents(models.CleanupEventFilter{WorkerID: &id}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 0 {
		t.Fatalf("cleanup audit rows for the kept worker: %+v", es)
	}
	for _, em := range since {
		if em.Room != events.Room(room) {
			continue
		}
		if ev, ok := em.Event.(events.TaskStatusEvent); ok && ev.ID == taskID {
			t.Fatalf("published %s for the kept worker's task", ev.Status)
		}
		if _, ok := em.Event.(events.JobsInvalidate); ok {
			t.Fatalf("published jobs_invalidate to %s while nothing changed", em.Room)
		}
	}
}

// A worker that opened a new socket and re-joined (a new session epoch)
// keeps everything when its old socket closes afterwards: the old socket's
// grace cleanup is fenced by the old epoch and finds nothing to do.
func TestSocketOldEpochGraceKeepsRejoinedWorker(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		watch := newGraceWatch()
		e := setup(t, db, withRealtime(realtimeCfg()), withRealtimeLog(watch))
		wid := e.registerJob(e.alice, "r1", "modifiers", "Rot")["worker_id"].(string)
		join := map[string]any{"job_name": "r1:modifiers:Rot", "worker_id": wid}
		oldSock := mustDialSIO(t, e.url, e.alice)
		oldSock.mustCall("join_job_room", join)
		id := e.submit(e.bob, "r1", "r1:modifiers:Rot", nil)
		e.claim(e.alice, wid)

		newSock := mustDialSIO(t, e.url, e.alice)
		newSock.mustCall("join_job_room", join)
		e.rec.take()
		oldSock.drop()
		watch.waitExpired(t, e, wid, 10*time.Second)
		assertKept(t, e, "r1", wid, id, e.rec.take())

		// The new socket is the live one: it hears about new tasks.
		next := e.submit(e.bob, "r1", "r1:modifiers:Rot", nil)
		newSock.waitEvent("task_available", 3*time.Second, func(p map[string]any) bool { return p["task_id"] == next })
	})
}

// Two nodes: a worker's socket on node A dies and the worker re-joins on
// node B within A's grace window. When A's grace timer fires, its cleanup
// (fenced by the epoch of A's binding) leaves the worker, its claim and its
// job alone.
func TestTwoNodesRebindWithinGraceKeepsWorker(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t, models.Postgres)
	node := func(name string) (*models.DB, *events.PGBus) { return pgNode(t, url, name) }
	dbA, busA := node("a")
	dbB, busB := node("b")
	// A's grace is long enough for the worker to reach B first, however
	// slow the machine; the test waits for the timer itself, not a guess.
	cfgA := realtimeCfg()
	cfgA.DisconnectGrace = 2 * time.Second
	watch := newGraceWatch()
	a := setup(t, dbA, withBus(busA), withRealtime(cfgA), withRealtimeLog(watch))
	b := setupShared(t, dbB, busB, a)

	wid := a.registerJob(a.alice, "mn", "modifiers", "Job")["worker_id"].(string)
	join := map[string]any{"job_name": "mn:modifiers:Job", "worker_id": wid}
	onA := mustDialSIO(t, a.url, a.alice)
	onA.mustCall("join_job_room", join)
	id := a.submit(a.bob, "mn", "mn:modifiers:Job", nil)
	a.claim(a.alice, wid)

	onA.drop()
	dropped := time.Now()
	onB := mustDialSIO(t, b.url, b.alice)
	onB.mustCall("join_job_room", join)
	if d := time.Since(dropped); d >= cfgA.DisconnectGrace {
		t.Fatalf("re-joining on node B took %s, longer than node A's grace", d)
	}
	a.rec.take()
	watch.waitExpired(t, a, wid, 10*time.Second)
	assertKept(t, a, "mn", wid, id, a.rec.take())
	if st := b.getTask(id)["status"]; st != "claimed" {
		t.Fatalf("node B sees the task %v", st)
	}
}

// A long-poll sleeps through the non-terminal changes (claimed, running)
// and answers when the task completes, with Preference-Applied.
func TestLongPollSleepsThroughClaimedAndRunning(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		wid := e.registerJob(e.alice, "lp", "modifiers", "Job")["worker_id"].(string)
		id := e.submit(e.bob, "lp", "lp:modifiers:Job", nil)
		done := make(chan resp, 1)
		go func() { done <- e.do(e.bob, "GET", api+"/tasks/"+id, nil, "Prefer: wait=30") }()
		// Correct code answers nothing before the completion, so these
		// pauses only give a wrong early answer the time to show.
		quiet := func(state string) {
			t.Helper()
			select {
			case r := <-done:
				t.Fatalf("long-poll answered while the task was %s: %d %s", state, r.Status, r.Body)
			case <-time.After(300 * time.Millisecond):
			}
		}
		quiet("pending")
		if c := e.claim(e.alice, wid); c == nil || c["id"] != id {
			t.Fatalf("claim %v", c)
		}
		quiet("claimed")
		e.patch(e.alice, id, "running").want(200)
		quiet("running")
		e.patch(e.alice, id, "completed").want(200)
		select {
		case r := <-done:
			if st := r.want(200).M()["status"]; st != "completed" {
				t.Fatalf("long-poll answered %v, want completed", st)
			}
			if h := r.Header.Get("Preference-Applied"); h != "wait=30" {
				t.Fatalf("Preference-Applied %q, want wait=30", h)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("long-poll did not answer the completion")
		}
	})
}

// Deleting one worker of a job leaves the job's other worker in place: the
// job still lists it and it claims the next task.
func TestDeletingOneWorkerKeepsOthersClaiming(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		gone, stays := e.newWorker(e.alice), e.newWorker(e.alice)
		e.registerJob(e.alice, "sh", "modifiers", "Job", map[string]any{"worker_id": gone})
		e.registerJob(e.alice, "sh", "modifiers", "Job", map[string]any{"worker_id": stays})
		e.do(e.alice, "DELETE", api+"/workers/"+gone, nil).want(204)

		job := e.do(e.bob, "GET", api+"/rooms/sh/jobs/sh:modifiers:Job", nil).want(200).M()
		if ws, _ := job["workers"].([]any); len(ws) != 1 || ws[0] != stays {
			t.Fatalf("job workers %v, want [%s]", job["workers"], stays)
		}
		id := e.submit(e.bob, "sh", "sh:modifiers:Job", nil)
		if c := e.claim(e.alice, stays); c == nil || c["id"] != id {
			t.Fatalf("the remaining worker claimed %v, want %s", c, id)
		}
		items := e.do(e.bob, "GET", api+"/rooms/sh/workers", nil).want(200).Items()
		if len(items) != 1 || items[0]["id"] != stays {
			t.Fatalf("room workers %v, want only %s", items, stays)
		}
	})
}
