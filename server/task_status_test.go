package server_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/joblib"
)

// --- test_router_task_status.py

// statusRig builds tasks in any state: pending tasks on a job nobody claims,
// the others on a job whose queue is empty whenever one is claimed.
type statusRig struct {
	e      *env
	worker string
	token  string
}

func newStatusRig(e *env, token string) *statusRig {
	e.t.Helper()
	e.registerJob(token, "room", "modifiers", "Idle")
	w := e.registerJob(token, "room", "modifiers", "Busy")["worker_id"].(string)
	return &statusRig{e: e, worker: w, token: token}
}

// task returns a new task in the given state (superuser PATCHes).
func (r *statusRig) task(state string) string {
	e := r.e
	e.t.Helper()
	if state == "pending" {
		return e.submit(e.alice, "room", "room:modifiers:Idle", nil)
	}
	id := e.submit(e.alice, "room", "room:modifiers:Busy", nil)
	if c := e.claim(r.token, r.worker); c == nil || c["id"] != id {
		e.t.Fatalf("rig claim got %v, want %s", c, id)
	}
	path := map[string][]string{
		"claimed":   nil,
		"running":   {"running"},
		"completed": {"running", "completed"},
		"failed":    {"running", "failed"},
		"cancelled": {"cancelled"},
	}[state]
	for _, s := range path {
		e.patch(e.admin, id, s).want(200)
	}
	return id
}

// The whole state machine of §3.1 through PATCH: the seven allowed
// transitions answer 200, every other pair (same state, backwards, out of a
// terminal state) 409 invalid-task-transition and leaves the task unchanged.
// pending → claimed is refused too: through PATCH it would leave a claimed
// task without a worker that nothing ever reaps (only POST /tasks/claim
// claims).
func TestTaskTransitionMatrix(t *testing.T) {
	t.Parallel()
	allowed := map[string][]string{
		"pending": {"cancelled"},
		"claimed": {"running", "failed", "cancelled"},
		"running": {"completed", "failed", "cancelled"},
	}
	states := []string{"pending", "claimed", "running", "completed", "failed", "cancelled"}
	each(t, func(t *testing.T, e *env) {
		rig := newStatusRig(e, e.alice)
		for _, from := range states {
			ok := map[string]bool{}
			for _, to := range allowed[from] {
				ok[to] = true
				id := rig.task(from)
				got := e.patch(e.admin, id, to).want(200).M()
				if got["status"] != to {
					t.Fatalf("%s→%s answered %v", from, to, got)
				}
			}
			id := rig.task(from)
			before := e.getTask(id)
			for _, to := range states {
				if ok[to] {
					continue
				}
				p := e.patch(e.admin, id, to).problem(409, "invalid-task-transition")
				want := fmt.Sprintf("Cannot transition from '%s' to '%s'", from, to)
				if from == "pending" && to == "claimed" {
					want += ": the task has no worker (workers claim tasks with POST /tasks/claim)"
				}
				if p["detail"] != want || p["title"] != "Conflict" {
					t.Fatalf("%s→%s: problem %v, want detail %q", from, to, p, want)
				}
			}
			after := e.getTask(id)
			for _, k := range []string{"status", "started_at", "completed_at", "error", "worker_id"} {
				if after[k] != before[k] {
					t.Fatalf("%s: refused transitions changed %s: %v → %v", from, k, before[k], after[k])
				}
			}
		}
	})
}

// Transitions set the contract's timestamps: running sets started_at, every
// terminal status completed_at; an error message is stored on terminal
// transitions only.
func TestTaskTransitionFields(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		rig := newStatusRig(e, e.alice)
		id := rig.task("claimed")
		r := e.do(e.alice, "PATCH", api+"/tasks/"+id, map[string]any{"status": "running", "error": "ignored"}).want(200).M()
		wantTime(t, "started_at", r["started_at"])
		if r["completed_at"] != nil || r["error"] != nil {
			t.Fatalf("running task %v", r)
		}
		r = e.patch(e.alice, id, "completed").want(200).M()
		started := wantTime(t, "started_at", r["started_at"])
		completed := wantTime(t, "completed_at", r["completed_at"])
		if completed.Before(started) || r["error"] != nil {
			t.Fatalf("completed task %v", r)
		}

		id = rig.task("running")
		r = e.do(e.alice, "PATCH", api+"/tasks/"+id, map[string]any{"status": "failed", "error": "boom"}).want(200).M()
		if r["error"] != "boom" || r["status"] != "failed" {
			t.Fatalf("failed task %v", r)
		}
		wantTime(t, "completed_at", r["completed_at"])

		id = rig.task("pending")
		r = e.do(e.admin, "PATCH", api+"/tasks/"+id, map[string]any{"status": "cancelled", "error": "no longer needed"}).want(200).M()
		if r["error"] != "no longer needed" || r["queue_position"] != nil {
			t.Fatalf("cancelled task %v", r)
		}
		wantTime(t, "completed_at", r["completed_at"])

		p := e.patch(e.admin, uuid.Nil.String(), "running").problem(404, "task-not-found")
		if p["detail"] != "Task '"+uuid.Nil.String()+"' not found" {
			t.Fatalf("detail %v", p["detail"])
		}
	})
}

// Who may PATCH: the owner of the claiming worker and superusers; another
// user gets 403. A pending task has no worker: a stranger gets 403 "Task not
// claimed by any worker". The submitter may cancel its task, pending,
// claimed or running (DESIGN improvement 3), but not otherwise move it.
func TestTaskUpdateAuthorization(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		rig := newStatusRig(e, e.alice)
		claimed := rig.task("claimed")
		p := e.patch(e.bob, claimed, "running").problem(403, "forbidden")
		if p["detail"] != "Not authorized to update this task" {
			t.Fatalf("detail %v", p["detail"])
		}
		// The submitter of a claimed task does not own its worker either:
		// it may cancel the task (its worker hears task_cancelled), not
		// move it otherwise.
		carol := e.user("carol", false)
		mine := e.do(carol, "POST", api+"/rooms/room/tasks/room:modifiers:Busy", map[string]any{"payload": map[string]any{}}).want(202).M()["id"].(string)
		if c := e.claim(e.alice, rig.worker); c["id"] != mine {
			t.Fatalf("claimed %v", c)
		}
		e.patch(carol, mine, "running").problem(403, "forbidden")
		if r := e.patch(carol, mine, "cancelled").want(200).M(); r["status"] != "cancelled" {
			t.Fatalf("submitter's cancel %v", r)
		}
		// A superuser may update anybody's task.
		if r := e.patch(e.admin, claimed, "running").want(200).M(); r["status"] != "running" {
			t.Fatalf("superuser update %v", r)
		}

		pending := rig.task("pending") // submitted by alice
		p = e.patch(e.bob, pending, "cancelled").problem(403, "forbidden")
		if p["detail"] != "Task not claimed by any worker" {
			t.Fatalf("detail %v", p["detail"])
		}
		e.patch(e.alice, pending, "claimed").problem(403, "forbidden")
		if got := e.getTask(pending); got["status"] != "pending" {
			t.Fatalf("refused updates changed the task: %v", got)
		}
		if r := e.patch(e.alice, pending, "cancelled").want(200).M(); r["status"] != "cancelled" {
			t.Fatalf("submitter cancel %v", r)
		}
		if r := e.patch(e.admin, rig.task("pending"), "cancelled").want(200).M(); r["status"] != "cancelled" {
			t.Fatalf("superuser cancel %v", r)
		}
	})
}

// GET /tasks/{id}: the task, 404 task-not-found for an unknown id.
func TestGetTask(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		e.seed()
		id := e.submit(e.alice, "room", rotate, nil)
		got := e.getTask(id)
		wantHasKeys(t, "task", got, taskFields...)
		if got["id"] != id || got["status"] != "pending" {
			t.Fatalf("task %v", got)
		}
		unknown := uuid.NewString()
		p := e.do(e.alice, "GET", api+"/tasks/"+unknown, nil).problem(404, "task-not-found")
		if p["detail"] != "Task '"+unknown+"' not found" {
			t.Fatalf("detail %v", p["detail"])
		}
	})
}

// Queue positions: 1-based rank among the job's pending tasks across all
// rooms, oldest first, in GET and in listings; null once not pending.
func TestQueuePositions(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		e.seed()
		a := e.submit(e.alice, "room_a", rotate, nil)
		b := e.submit(e.alice, "room_b", rotate, nil)
		c := e.submit(e.alice, "room_a", rotate, nil)
		for i, id := range []string{a, b, c} {
			if got := e.getTask(id)["queue_position"]; got != float64(i+1) {
				t.Fatalf("task %d position %v, want %d", i, got, i+1)
			}
		}
		// room_a sees positions 1 and 3 (the per-job rank spans rooms).
		p := e.do(e.alice, "GET", api+"/rooms/room_a/tasks", nil).want(200).page()
		if pos := p.field("queue_position"); len(pos) != 2 || pos[0] != 3.0 || pos[1] != 1.0 {
			t.Fatalf("room_a positions %v, want [3 1] (newest first)", pos)
		}
		e.patch(e.admin, a, "cancelled").want(200)
		if got := e.getTask(a)["queue_position"]; got != nil {
			t.Fatalf("cancelled task position %v, want null", got)
		}
		if got := e.getTask(b)["queue_position"]; got != 1.0 {
			t.Fatalf("position after cancel %v, want 1", got)
		}
		if got := e.getTask(c)["queue_position"]; got != 2.0 {
			t.Fatalf("position after cancel %v, want 2", got)
		}
	})
}

// Room task listings: only the room's own tasks (no @global fan-in), the
// status filter, and positions 1, 2, 3 for three pending tasks.
func TestListTasksForRoom(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		e.seed()
		p := e.do(e.alice, "GET", api+"/rooms/room1/tasks", nil).want(200).page()
		if p.Total != 0 || len(p.Items) != 0 {
			t.Fatalf("empty listing %+v", p)
		}
		t1 := e.submit(e.alice, "room1", rotate, nil)
		t2 := e.submit(e.alice, "room1", rotate, nil)
		e.submit(e.alice, "room2", rotate, nil)
		p = e.do(e.alice, "GET", api+"/rooms/room1/tasks", nil).want(200).page()
		if p.Total != 2 || len(p.Items) != 2 {
			t.Fatalf("room1 tasks %+v", p)
		}
		for _, it := range p.Items {
			wantHasKeys(t, "listed task", it, taskFields...)
			if it["room_id"] != "room1" {
				t.Fatalf("foreign task listed: %v", it)
			}
		}
		if n := e.total(api + "/rooms/@global/tasks"); n != 0 {
			t.Fatalf("@global lists %d tasks", n)
		}

		e.patch(e.admin, t1, "cancelled").want(200)
		p = e.do(e.alice, "GET", api+"/rooms/room1/tasks?status=pending", nil).want(200).page()
		if p.Total != 1 || p.Items[0]["id"] != t2 {
			t.Fatalf("pending filter %+v", p)
		}
		p = e.do(e.alice, "GET", api+"/rooms/room1/tasks?status=cancelled", nil).want(200).page()
		if p.Total != 1 || p.Items[0]["id"] != t1 {
			t.Fatalf("cancelled filter %+v", p)
		}

		for range 3 {
			e.submit(e.alice, "room3", rotate, nil)
		}
		pos := e.do(e.alice, "GET", api+"/rooms/room3/tasks", nil).want(200).page().field("queue_position")
		// t2 and room2's task are still pending ahead of them in the job's queue.
		if len(pos) != 3 || pos[0] != 5.0 || pos[1] != 4.0 || pos[2] != 3.0 {
			t.Fatalf("room3 positions %v, want [5 4 3]", pos)
		}
	})
}

// Job task listings: only that job's tasks submitted to that room; 404 for
// unknown or soft-deleted jobs; a @global job's tasks are split by room.
func TestListTasksForJob(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		e.seed()
		e.registerJob(e.admin, "@global", "modifiers", "Scale")
		path := func(room, job string) string { return api + "/rooms/" + room + "/jobs/" + job + "/tasks" }
		p := e.do(e.alice, "GET", path("@global", rotate), nil).want(200).page()
		if p.Total != 0 || len(p.Items) != 0 {
			t.Fatalf("empty listing %+v", p)
		}
		a := e.submit(e.alice, "room_a", rotate, nil)
		b := e.submit(e.alice, "room_b", rotate, nil)
		e.submit(e.alice, "room_a", "@global:modifiers:Scale", nil)

		p = e.do(e.alice, "GET", path("room_a", rotate), nil).want(200).page()
		if p.Total != 1 || p.Items[0]["id"] != a || p.Items[0]["job_name"] != rotate {
			t.Fatalf("room_a Rotate tasks %+v", p)
		}
		p = e.do(e.alice, "GET", path("room_b", rotate), nil).want(200).page()
		if p.Total != 1 || p.Items[0]["id"] != b {
			t.Fatalf("room_b Rotate tasks %+v", p)
		}
		if n := e.total(path("@global", rotate)); n != 0 {
			t.Fatalf("@global sees %d of the rooms' tasks", n)
		}
		if n := e.total(path("room_b", rotate) + "?status=claimed"); n != 0 {
			t.Fatalf("status filter: %d claimed", n)
		}
		e.do(e.alice, "GET", path("room_a", "@global:modifiers:Nope"), nil).problem(404, "job-not-found")
	})
}

// test_router_task_status.py: a pending task keeps its job alive after its
// worker left; cancelling that last pending task soft-deletes the job, but
// the task stays readable under the job's name.
func TestOrphanJobSoftDeletedOnTaskCompletion(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w := e.registerJob(e.admin, "room_x", "modifiers", "Job")["worker_id"].(string)
		id := e.submit(e.admin, "room_x", "room_x:modifiers:Job", nil)
		e.do(e.admin, "DELETE", api+"/workers/"+w, nil).want(204)
		e.do(e.admin, "GET", api+"/rooms/room_x/jobs/room_x:modifiers:Job", nil).want(200)

		r := e.patch(e.admin, id, "cancelled").want(200).M()
		if r["job_name"] != "room_x:modifiers:Job" {
			t.Fatalf("job_name %v", r["job_name"])
		}
		e.do(e.admin, "GET", api+"/rooms/room_x/jobs/room_x:modifiers:Job", nil).problem(404, "job-not-found")
		e.do(e.admin, "GET", api+"/rooms/room_x/jobs/room_x:modifiers:Job/tasks", nil).problem(404, "job-not-found")
		e.do(e.admin, "POST", api+"/rooms/room_x/tasks/room_x:modifiers:Job", map[string]any{}).problem(404, "job-not-found")
		got := e.getTask(id)
		if got["status"] != "cancelled" || got["job_name"] != "room_x:modifiers:Job" {
			t.Fatalf("task after soft-delete %v", got)
		}
	})
}

// Prefer: no header, a terminal task, wait=0, wait=abc and tokens without
// wait return at once without Preference-Applied.
func TestPreferReturnsImmediately(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		e.seed()
		pending := e.submit(e.alice, "room", rotate, nil)
		done := e.submit(e.alice, "room", rotate, nil)
		e.patch(e.admin, done, "cancelled").want(200)
		cases := []struct{ id, prefer string }{
			{pending, ""}, {pending, "wait=0"}, {pending, "wait=abc"}, {pending, "wait=5abc"}, {pending, "respond-async"},
			{done, "wait=30"},
		}
		for _, c := range cases {
			start := time.Now()
			var r resp
			if c.prefer == "" {
				r = e.do(e.alice, "GET", api+"/tasks/"+c.id, nil).want(200)
			} else {
				r = e.do(e.alice, "GET", api+"/tasks/"+c.id, nil, "Prefer: "+c.prefer).want(200)
			}
			if h, ok := r.Header["Preference-Applied"]; ok {
				t.Fatalf("Prefer %q: Preference-Applied %v", c.prefer, h)
			}
			if d := time.Since(start); d > 500*time.Millisecond {
				t.Fatalf("Prefer %q took %s", c.prefer, d)
			}
		}
	})
}

// Prefer: wait=1 on a pending task waits about a second and reports
// Preference-Applied: wait=1; waits above the configured maximum are capped
// and the cap is what is reported. Both wait forms of the contract's parser
// tests are accepted.
func TestPreferWaitApplied(t *testing.T) {
	t.Parallel()
	opts := []func(*setupOpts){withSettings(func(s *joblib.Settings) { s.LongPollMaxWait = 1 * time.Second })}
	eachWith(t, opts, func(t *testing.T, e *env) {
		e.seed()
		id := e.submit(e.alice, "room", rotate, nil)
		var wg sync.WaitGroup
		for _, prefer := range []string{"wait=1", "wait=30, respond-async", "respond-async, wait=60"} {
			wg.Go(func() {
				start := time.Now()
				r := e.do(e.alice, "GET", api+"/tasks/"+id, nil, "Prefer: "+prefer)
				d := time.Since(start)
				if r.Status != 200 || r.Header.Get("Preference-Applied") != "wait=1" {
					t.Errorf("Prefer %q: %d, Preference-Applied %q", prefer, r.Status, r.Header.Get("Preference-Applied"))
				}
				if d < 900*time.Millisecond || d > 5*time.Second {
					t.Errorf("Prefer %q returned after %s, want about 1s", prefer, d)
				}
			})
		}
		wg.Wait()
		if got := e.getTask(id); got["status"] != "pending" {
			t.Fatalf("task %v", got)
		}
	})
}

// DESIGN improvement 8: a long-poll wakes on the change itself. A GET with
// Prefer: wait=30 returns as soon as the task is cancelled, reporting wait=30.
func TestPreferWaitWakesOnChange(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		e.seed()
		// The GET may read the task after the PATCH (then it answers at once
		// without waiting); repeat until one attempt observed the wait.
		for attempt := range 20 {
			id := e.submit(e.alice, "room", rotate, nil)
			done := make(chan resp, 1)
			start := time.Now()
			go func() { done <- e.do(e.alice, "GET", api+"/tasks/"+id, nil, "Prefer: wait=30") }()
			e.getTask(id) // let the long-poll get going
			e.patch(e.admin, id, "cancelled").want(200)
			r := <-done
			d := time.Since(start)
			if r.Status != 200 || r.M()["status"] != "cancelled" {
				t.Fatalf("long-poll answered %d %s", r.Status, r.Body)
			}
			if d > 5*time.Second {
				t.Fatalf("long-poll returned after %s, not on the change", d)
			}
			if h := r.Header.Get("Preference-Applied"); h != "" {
				if h != "wait=30" {
					t.Fatalf("Preference-Applied %q", h)
				}
				return
			}
			t.Logf("attempt %d: the change came first", attempt)
		}
		t.Fatal("no attempt observed a waiting long-poll")
	})
}
