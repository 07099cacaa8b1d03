package server_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// Task limits on the wire: a job's task_timeout, heartbeat_timeout and
// on_timeout are returned with it; a submission's own timeout overrides
// task_timeout for its task; a claim returns the task's deadline_at (the
// earlier limit from the claim, on the database clock). Limits that are
// not whole positive seconds, or a policy other than fail/requeue, are 422;
// another user cannot change a job's limits (409).
func TestTaskLimitsOnTheWire(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		j := e.registerJob(e.alice, "lim", "modifiers", "Job", map[string]any{"task_timeout": 30, "heartbeat_timeout": 10, "on_timeout": "requeue"})
		if j["task_timeout"] != float64(30) || j["heartbeat_timeout"] != float64(10) || j["on_timeout"] != "requeue" {
			t.Fatalf("job %v", j)
		}
		plain := e.registerJob(e.alice, "lim", "modifiers", "Plain")
		if plain["task_timeout"] != nil || plain["heartbeat_timeout"] != nil || plain["on_timeout"] != "fail" {
			t.Fatalf("job without limits %v", plain)
		}
		for _, bad := range []map[string]any{{"task_timeout": 0}, {"heartbeat_timeout": -1}, {"task_timeout": 1.5}, {"task_timeout": "30"}, {"on_timeout": "retry"}} {
			body := map[string]any{"category": "modifiers", "name": "Bad", "schema": map[string]any{}}
			for k, v := range bad {
				body[k] = v
			}
			if r := e.do(e.alice, "PUT", api+"/rooms/lim/jobs", body); r.Status != 422 {
				t.Fatalf("limits %v: %d %s", bad, r.Status, r.Body)
			}
		}
		e.do(e.bob, "PUT", api+"/rooms/lim/jobs", map[string]any{"category": "modifiers", "name": "Job", "schema": map[string]any{}, "task_timeout": 5}).problem(409, "policy-conflict")

		id := e.do(e.bob, "POST", api+"/rooms/lim/tasks/lim:modifiers:Job", map[string]any{"payload": map[string]any{}, "timeout": 5}).want(202).M()["id"].(string)
		e.do(e.bob, "POST", api+"/rooms/lim/tasks/lim:modifiers:Job", map[string]any{"payload": map[string]any{}, "timeout": 0}).problem(422, "validation-error")
		tk := e.claim(e.alice, j["worker_id"].(string))
		if tk["id"] != id || tk["task_timeout"] != float64(5) || tk["heartbeat_timeout"] != float64(10) {
			t.Fatalf("claimed %v", tk)
		}
		claimed := wantTime(t, "claimed deadline_at", tk["deadline_at"])
		got := e.getTask(id)
		if deadline := wantTime(t, "deadline_at", got["deadline_at"]); !deadline.Equal(claimed) {
			t.Fatalf("deadline %s, claim answered %s", deadline, claimed)
		}
		if got["progress"] != nil || got["progress_at"] != nil {
			t.Fatalf("progress before any report: %v", got)
		}
	})
}

// Progress over both transports: PATCH {"progress"} (alone, or with a
// status) and the acknowledged task_progress socket event. Each is stored
// (GET and the listings return it), moves the deadline, and reaches the
// room's UIs as task_progress_event. Only the holder's owner may report.
func TestProgressOverRESTAndSocket(t *testing.T) {
	t.Parallel()
	eachRealtime(t, func(t *testing.T, e *env) {
		j := e.registerJob(e.alice, "prog", "modifiers", "Job", map[string]any{"heartbeat_timeout": 60})
		wid := j["worker_id"].(string)
		w := mustDialSIO(t, e.url, e.alice)
		w.mustCall("join_job_room", map[string]any{"job_name": "prog:modifiers:Job", "worker_id": wid})
		ui := mustDialSIO(t, e.url, e.bob)
		ui.mustCall("join_room", map[string]any{"room_id": "prog"})
		id := e.submit(e.bob, "prog", "prog:modifiers:Job", nil)
		e.claim(e.alice, wid)
		before := wantTime(t, "deadline", e.getTask(id)["deadline_at"])
		time.Sleep(20 * time.Millisecond)

		r := e.do(e.alice, "PATCH", api+"/tasks/"+id, map[string]any{"progress": map[string]any{"current": 3, "total": 10, "message": "loading"}}).want(200).M()
		p, _ := r["progress"].(map[string]any)
		if r["status"] != "claimed" || p["current"] != float64(3) || p["total"] != float64(10) || p["message"] != "loading" {
			t.Fatalf("progress answer %v", r)
		}
		at := wantTime(t, "progress_at", r["progress_at"])
		if after := wantTime(t, "deadline", r["deadline_at"]); !after.After(before) || after.Sub(at) != time.Minute {
			t.Fatalf("deadline %s → %s (progress at %s): want progress + 60s", before, after, at)
		}
		ev := ui.waitEvent("task_progress_event", 3*time.Second, func(m map[string]any) bool { return m["id"] == id })
		wantKeys(t, "task_progress_event", ev.Payload, "id", "room_id", "job_name", "current", "total", "message", "progress_at")
		if ev.Payload["job_name"] != "prog:modifiers:Job" || ev.Payload["room_id"] != "prog" || ev.Payload["current"] != float64(3) {
			t.Fatalf("task_progress_event %v", ev.Payload)
		}

		// With a status: the progress, then the transition.
		r = e.do(e.alice, "PATCH", api+"/tasks/"+id, map[string]any{"status": "running", "progress": map[string]any{"current": 4, "total": 10}}).want(200).M()
		if p, _ := r["progress"].(map[string]any); r["status"] != "running" || p["current"] != float64(4) {
			t.Fatalf("progress with status %v", r)
		}
		// Over the socket, acknowledged.
		if a := w.call("task_progress", map[string]any{"task_id": id, "current": 9, "total": 10, "message": "almost"}); a["ok"] != true {
			t.Fatalf("task_progress ack %v", a)
		}
		ui.waitEvent("task_progress_event", 3*time.Second, func(m map[string]any) bool { return m["id"] == id && m["current"] == float64(9) })
		listed := e.do(e.bob, "GET", api+"/rooms/prog/tasks", nil).want(200).Items()
		if p, _ := listed[0]["progress"].(map[string]any); p["current"] != float64(9) || p["message"] != "almost" || listed[0]["progress_at"] == nil {
			t.Fatalf("listed %v", listed[0])
		}
		// Someone else's worker's task, a bad id, a bad body.
		e.do(e.bob, "PATCH", api+"/tasks/"+id, map[string]any{"progress": map[string]any{"current": 1}}).problem(403, "forbidden")
		if a := ui.call("task_progress", map[string]any{"task_id": id, "current": 1}); a["status"] != float64(403) {
			t.Fatalf("another user's task_progress: %v", a)
		}
		if a := w.call("task_progress", map[string]any{"task_id": "nope"}); a["status"] != float64(422) || a["type"] != "/v1/problems/validation-error" {
			t.Fatalf("bad task_progress: %v", a)
		}
		if a := w.call("task_progress", map[string]any{"task_id": id, "current": "x"}); a["status"] != float64(422) || a["type"] != "/v1/problems/validation-error" {
			t.Fatalf("bad task_progress: %v", a)
		}
		// A bare number is the current value; a value of another kind is
		// ignored, as unknown fields always were.
		if r := e.do(e.alice, "PATCH", api+"/tasks/"+id, map[string]any{"progress": 7}).want(200).M(); r["progress"].(map[string]any)["current"] != float64(7) {
			t.Fatalf("bare number progress %v", r["progress"])
		}
		e.do(e.alice, "PATCH", api+"/tasks/"+id, map[string]any{"progress": "half"}).problem(422, "validation-error") // no status either
		// A superuser's status override carrying progress: the override
		// applies, the progress (not the holder's owner's) is dropped.
		other := e.submit(e.bob, "prog", "prog:modifiers:Job", nil)
		e.claim(e.alice, wid)
		if r := e.do(e.admin, "PATCH", api+"/tasks/"+other, map[string]any{"status": "running", "progress": map[string]any{"current": 1}}).want(200).M(); r["progress"] != nil {
			t.Fatalf("override with progress %v", r)
		}
		e.do(e.alice, "PATCH", api+"/tasks/"+uuid.NewString(), map[string]any{"progress": map[string]any{}}).problem(404, "task-not-found")
		e.patch(e.alice, id, "completed").want(200)
		e.do(e.alice, "PATCH", api+"/tasks/"+id, map[string]any{"progress": map[string]any{"current": 10}}).problem(409, "invalid-task-transition")
	})
}

// A held task's end reaches its worker's socket at once: the submitter's
// cancel (PATCH), an operator's (the dashboard's cancel) and a timeout each
// send task_cancelled {task_id, reason} to the socket bound to the worker
// holding it; the worker's late report then gets 409.
func TestCancelReachesTheHoldingWorker(t *testing.T) {
	t.Parallel()
	eachRealtime(t, func(t *testing.T, e *env) {
		j := e.registerJob(e.alice, "cx", "modifiers", "Job")
		wid := j["worker_id"].(string)
		w := mustDialSIO(t, e.url, e.alice)
		w.mustCall("join_job_room", map[string]any{"job_name": "cx:modifiers:Job", "worker_id": wid})
		cancelled := func(id string) map[string]any {
			t.Helper()
			return w.waitEvent("task_cancelled", 3*time.Second, func(m map[string]any) bool { return m["task_id"] == id }).Payload
		}

		byBob := e.submit(e.bob, "cx", "cx:modifiers:Job", nil)
		e.claim(e.alice, wid)
		e.patch(e.alice, byBob, "running").want(200)
		e.patch(e.bob, byBob, "cancelled").want(200)
		if ev := cancelled(byBob); ev["reason"] != "cancelled by bob" {
			t.Fatalf("task_cancelled %v", ev)
		}
		e.patch(e.alice, byBob, "completed").problem(409, "invalid-task-transition")

		byOperator := e.submit(e.bob, "cx", "cx:modifiers:Job", nil)
		e.claim(e.alice, wid)
		e.do(e.admin, "POST", api+"/dashboard/tasks/"+byOperator+"/cancel", nil).want(200)
		if ev := cancelled(byOperator); ev["reason"] != joblib.ErrCancelledByOperator {
			t.Fatalf("task_cancelled %v", ev)
		}

		timed := e.do(e.bob, "POST", api+"/rooms/cx/tasks/cx:modifiers:Job", map[string]any{"payload": map[string]any{}, "timeout": 1}).want(202).M()["id"].(string)
		e.claim(e.alice, wid)
		time.Sleep(1100 * time.Millisecond)
		if _, err := e.svc.TimeOutTasks(t.Context(), nil, joblib.LeaderFence{}); err != nil {
			t.Fatal(err)
		}
		if ev := cancelled(timed); ev["reason"] != "Task timed out: task_timeout of 1s passed since the claim" {
			t.Fatalf("task_cancelled %v", ev)
		}
		if got := len(w.eventsNamed("task_cancelled")); got != 3 {
			t.Fatalf("%d task_cancelled, want 3", got)
		}
		// The dashboard lists the timeout among the cleanups, with its
		// evidence (database time throughout).
		d := e.do(e.admin, "GET", api+"/dashboard", nil).want(200).M()
		tos, _ := d["timeouts"].([]any)
		if len(tos) != 1 {
			t.Fatalf("dashboard timeouts %v", d["timeouts"])
		}
		to := tos[0].(map[string]any)
		if to["task_id"] != timed || to["limit"] != "task_timeout" || to["seconds"] != float64(1) || to["outcome"] != "failed" ||
			to["worker_id"] != wid || to["job"] != "cx:modifiers:Job" || to["progress_at"] != nil {
			t.Fatalf("dashboard timeout %v", to)
		}
		claimedAt, dbNow := wantTime(t, "claimed_at", to["claimed_at"]), wantTime(t, "db_now", to["db_now"])
		if late := dbNow.Sub(claimedAt); late < time.Second || late > time.Minute {
			t.Fatalf("evidence: judged %s after the claim", late)
		}
	})
}

// The worker's socket on node B hears of a cancel sent to node A, and of a
// timeout node A's sweep found, within a moment.
func TestTaskCancelledReachesWorkerOnAnotherNode(t *testing.T) {
	t.Parallel()
	a, b := twoNodes(t)
	wid := a.registerJob(a.alice, "xn", "modifiers", "Job")["worker_id"].(string)
	w := mustDialSIO(t, b.url, b.alice)
	w.mustCall("join_job_room", map[string]any{"job_name": "xn:modifiers:Job", "worker_id": wid})
	id := a.submit(a.bob, "xn", "xn:modifiers:Job", nil)
	a.claim(a.alice, wid)
	sent := time.Now()
	a.patch(a.bob, id, "cancelled").want(200)
	w.waitEvent("task_cancelled", 3*time.Second, func(m map[string]any) bool { return m["task_id"] == id && m["reason"] == "cancelled by bob" })
	t.Logf("cancel on node A -> task_cancelled on node B: %s", time.Since(sent))

	timed := a.do(a.bob, "POST", api+"/rooms/xn/tasks/xn:modifiers:Job", map[string]any{"payload": map[string]any{}, "timeout": 1}).want(202).M()["id"].(string)
	a.claim(a.alice, wid)
	time.Sleep(1100 * time.Millisecond)
	if _, err := a.svc.TimeOutTasks(t.Context(), nil, joblib.LeaderFence{}); err != nil {
		t.Fatal(err)
	}
	w.waitEvent("task_cancelled", 3*time.Second, func(m map[string]any) bool { return m["task_id"] == timed })
}

// task_cancelled reaches a real python-socketio worker, connected to node B,
// when the task's submitter cancels it through node A.
func TestTaskCancelledReachesPythonWorkerOnAnotherNode(t *testing.T) {
	t.Parallel()
	requirePythonClient(t)
	a, b := twoNodes(t)
	wid := a.registerJob(a.alice, "py", "modifiers", "Job")["worker_id"].(string)
	_, _, lines := pythonProcess(t, "joblib_cancel_worker.py", "JOBLIB_URL="+b.url, "TOKEN="+b.alice, "JOB_NAME=py:modifiers:Job", "WORKER_ID="+wid)
	id := a.submit(a.bob, "py", "py:modifiers:Job", nil)
	a.claim(a.alice, wid)
	a.patch(a.bob, id, "cancelled").want(200)
	want := `task_cancelled {"reason": "cancelled by bob", "task_id": "` + id + `"}`
	select {
	case l := <-lines:
		if l != want {
			t.Fatalf("the worker printed %q, want %q", l, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no task_cancelled reached the python worker within 5s")
	}
}

// A hung task's end reaches a UI within one sweep interval of its deadline:
// the sweeper runs as serve runs it, the worker stays alive through its
// socket, and the UI receives the failed task_status_event.
func TestTimeoutReachesUIWithinASweepInterval(t *testing.T) {
	t.Parallel()
	const interval = 200 * time.Millisecond
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		e := setup(t, db, withRealtime(realtimeCfg()), withSettings(func(s *joblib.Settings) {
			s.WorkerTimeout, s.SweeperInterval = time.Second, interval
		}))
		sw := joblib.NewSweeper(e.svc, joblib.SweeperConfig{Jitter: -1, Probe: 50 * time.Millisecond, Leader: db.NewLeaderLease("sweeper-"+uuid.NewString(), e.svc.Node().Run, 10*time.Second)})
		if err := sw.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(sw.Stop)
		wid := e.registerJob(e.alice, "ui", "modifiers", "Job", map[string]any{"task_timeout": 2})["worker_id"].(string)
		w := mustDialSIO(t, e.url, e.alice)
		w.mustCall("join_job_room", map[string]any{"job_name": "ui:modifiers:Job", "worker_id": wid})
		ui := mustDialSIO(t, e.url, e.bob)
		ui.mustCall("join_room", map[string]any{"room_id": "ui"})
		id := e.submit(e.bob, "ui", "ui:modifiers:Job", nil)
		deadline := wantTime(t, "deadline_at", e.claim(e.alice, wid)["deadline_at"])
		ui.waitEvent("task_status_event", 10*time.Second, func(m map[string]any) bool { return m["id"] == id && m["status"] == "failed" })
		late := time.Since(deadline)
		t.Logf("deadline -> task_status_event at the UI: %s (sweep interval %s)", late, interval)
		if late > interval+time.Second {
			t.Fatalf("the UI heard of the timeout %s after the deadline", late)
		}
		w.waitEvent("task_cancelled", time.Second, func(m map[string]any) bool { return m["task_id"] == id })
		if _, err := e.db.Q(t.Context()).GetWorker(uuid.MustParse(wid)); err != nil {
			t.Fatalf("the live worker: %v", err)
		}
	})
}
