package server_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestWorkerLifecycle(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w := e.do(e.alice, "POST", api+"/workers", nil).want(201).M()
		id := w["id"].(string)
		if _, ok := w["last_heartbeat"].(string); !ok {
			t.Fatalf("no last_heartbeat in %v", w)
		}
		first := e.do(e.alice, "PATCH", api+"/workers/"+id, nil).want(200).M()["last_heartbeat"].(string)
		time.Sleep(10 * time.Millisecond)
		second := e.do(e.alice, "PATCH", api+"/workers/"+id, nil).want(200).M()["last_heartbeat"].(string)
		if !(second > first) {
			t.Fatalf("heartbeat did not advance: %s then %s", first, second)
		}
		// superusers are not exempt from heartbeat ownership
		e.do(e.admin, "PATCH", api+"/workers/"+id, nil).problem(403, "forbidden")
		e.do(e.bob, "DELETE", api+"/workers/"+id, nil).problem(403, "forbidden")
		e.do(e.alice, "DELETE", api+"/workers/"+id, nil).want(204)
		e.do(e.alice, "PATCH", api+"/workers/"+id, nil).problem(404, "worker-not-found")
		e.do(e.alice, "DELETE", api+"/workers/"+id, nil).problem(404, "worker-not-found")
		e.do(e.alice, "PATCH", api+"/workers/not-a-uuid", nil).problem(422, "validation-error")
	})
}

// test_router_worker.py: POST /workers answers 201 with {id, last_heartbeat}.
func TestCreateWorker(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w := e.do(e.alice, "POST", api+"/workers", nil).want(201).M()
		wantKeys(t, "worker", w, "id", "last_heartbeat")
		if _, err := uuid.Parse(w["id"].(string)); err != nil {
			t.Fatalf("id %v is not a UUID", w["id"])
		}
		wantTime(t, "last_heartbeat", w["last_heartbeat"])
		if n := e.total(api + "/workers"); n != 1 {
			t.Fatalf("workers total %d, want 1", n)
		}
		// Creating a worker emits nothing.
		if ems := e.emissions(); len(ems) != 0 {
			t.Fatalf("POST /workers emitted %v", ems)
		}
	})
}

// test_router_worker.py: unknown workers are 404 worker-not-found on
// heartbeat and delete, with the contract's detail.
func TestWorkerNotFound(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		nilID := uuid.Nil.String()
		p := e.do(e.alice, "PATCH", api+"/workers/"+nilID, nil).problem(404, "worker-not-found")
		if p["detail"] != "Worker '"+nilID+"' not found" || p["title"] != "Not Found" {
			t.Fatalf("problem %v", p)
		}
		e.do(e.alice, "DELETE", api+"/workers/"+nilID, nil).problem(404, "worker-not-found")
	})
}

// test_router_worker.py: deleting the only worker of a job soft-deletes the
// job (404), unless a pending task keeps it alive (then it shows no workers);
// once all its tasks are terminal the delete removes it.
func TestWorkerDeleteOrphanRules(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		job := func(name string) string { return api + "/rooms/@global/jobs/@global:modifiers:" + name }

		// removes the orphan job
		w := e.registerJob(e.admin, "@global", "modifiers", "Lonely")["worker_id"].(string)
		e.do(e.admin, "DELETE", api+"/workers/"+w, nil).want(204)
		e.do(e.admin, "GET", job("Lonely"), nil).problem(404, "job-not-found")

		// keeps a job with a pending task, with an empty worker list
		w = e.registerJob(e.admin, "@global", "modifiers", "Busy")["worker_id"].(string)
		e.submit(e.admin, "room_1", "@global:modifiers:Busy", nil)
		e.do(e.admin, "DELETE", api+"/workers/"+w, nil).want(204)
		got := e.do(e.admin, "GET", job("Busy"), nil).want(200).M()
		if ws := got["workers"].([]any); len(ws) != 0 {
			t.Fatalf("workers %v, want []", ws)
		}

		// removes a job whose tasks all finished
		w = e.registerJob(e.admin, "@global", "modifiers", "Done")["worker_id"].(string)
		id := e.submit(e.admin, "room_1", "@global:modifiers:Done", nil)
		if c := e.claim(e.admin, w); c["id"] != id {
			t.Fatalf("claimed %v, want %s", c, id)
		}
		e.patch(e.admin, id, "running").want(200)
		e.patch(e.admin, id, "completed").want(200)
		e.do(e.admin, "GET", job("Done"), nil).want(200) // the link keeps it alive
		e.do(e.admin, "DELETE", api+"/workers/"+w, nil).want(204)
		e.do(e.admin, "GET", job("Done"), nil).problem(404, "job-not-found")
	})
}

// test_router_worker.py: three users register the same room job; the job's
// worker list grows 1, 2, 3 (201, 200, 200) and shrinks as workers leave.
func TestWorkersListChangesWithWorkers(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		users := []string{e.alice, e.bob, e.user("carol", false)}
		path := api + "/rooms/room_1/jobs"
		var workers []string
		for i, tok := range users {
			r := e.do(tok, "PUT", path, map[string]any{"category": "modifiers", "name": "Shared", "schema": map[string]any{}})
			want := 200
			if i == 0 {
				want = 201
			}
			j := r.want(want).M()
			workers = append(workers, j["worker_id"].(string))
			if n := len(j["workers"].([]any)); n != i+1 {
				t.Fatalf("registration %d: %d workers, want %d", i+1, n, i+1)
			}
		}
		job := api + "/rooms/room_1/jobs/room_1:modifiers:Shared"
		e.do(users[0], "DELETE", api+"/workers/"+workers[0], nil).want(204)
		if ws := e.do(e.admin, "GET", job, nil).want(200).M()["workers"].([]any); len(ws) != 2 {
			t.Fatalf("after one delete: %v", ws)
		}
		e.do(users[1], "DELETE", api+"/workers/"+workers[1], nil).want(204)
		ws := e.do(e.admin, "GET", job, nil).want(200).M()["workers"].([]any)
		if len(ws) != 1 || ws[0] != workers[2] {
			t.Fatalf("after two deletes: %v, want [%s]", ws, workers[2])
		}
	})
}

// test_router_worker.py: deleting a worker fails its running task with
// "Worker disconnected", soft-deletes the orphaned job, and the task stays
// readable with its payload and job name.
func TestWorkerDeleteFailsRunningTasks(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w := e.registerJob(e.alice, "room_x", "modifiers", "Job")["worker_id"].(string)
		running := e.submit(e.alice, "room_x", "room_x:modifiers:Job", map[string]any{"n": 1})
		done := e.submit(e.alice, "room_x", "room_x:modifiers:Job", map[string]any{"n": 2})
		for _, id := range []string{running, done} {
			if c := e.claim(e.alice, w); c["id"] != id {
				t.Fatalf("claimed %v, want %s", c["id"], id)
			}
			e.patch(e.alice, id, "running").want(200)
		}
		e.patch(e.alice, done, "completed").want(200)

		e.do(e.alice, "DELETE", api+"/workers/"+w, nil).want(204)

		got := e.getTask(running)
		if got["status"] != "failed" || !strings.Contains(strings.ToLower(fmt.Sprint(got["error"])), "worker disconnected") {
			t.Fatalf("running task after delete: %v", got)
		}
		wantTime(t, "completed_at", got["completed_at"])
		e.do(e.admin, "GET", api+"/rooms/room_x/jobs/room_x:modifiers:Job", nil).problem(404, "job-not-found")

		old := e.getTask(done)
		if old["status"] != "completed" || old["job_name"] != "room_x:modifiers:Job" || old["payload"].(map[string]any)["n"] != 2.0 {
			t.Fatalf("completed task after job soft-delete: %v", old)
		}
	})
}

// test_router_worker.py: GET /workers lists every worker; registrations
// without worker_id create one worker each.
func TestListWorkers(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		p := e.do(e.admin, "GET", api+"/workers", nil).want(200).page()
		if p.Total != 0 || len(p.Items) != 0 || p.Limit != 50 || p.Offset != 0 {
			t.Fatalf("empty listing %+v", p)
		}
		for _, n := range []string{"A", "B", "C"} {
			e.registerJob(e.admin, "@global", "modifiers", n)
		}
		p = e.do(e.admin, "GET", api+"/workers", nil).want(200).page()
		if p.Total != 3 || len(p.Items) != 3 {
			t.Fatalf("listing %+v, want 3 workers", p)
		}
		for _, it := range p.Items {
			wantKeys(t, "worker summary", it, "id", "last_heartbeat", "job_count")
			wantTime(t, "last_heartbeat", it["last_heartbeat"])
			if it["job_count"] != 1.0 {
				t.Fatalf("job_count %v, want 1", it["job_count"])
			}
		}
	})
}

// test_router_worker.py: a room's workers are those linked to the jobs it
// sees (its own and @global's), not other rooms'.
func TestListWorkersForRoom(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		p := e.do(e.admin, "GET", api+"/rooms/room1/workers", nil).want(200).page()
		if p.Total != 0 || len(p.Items) != 0 {
			t.Fatalf("empty room listing %+v", p)
		}
		global := e.seed()
		r1a := e.registerJob(e.alice, "room1", "modifiers", "A")["worker_id"].(string)
		r1b := e.registerJob(e.alice, "room1", "modifiers", "B")["worker_id"].(string)
		r2 := e.registerJob(e.bob, "room2", "modifiers", "C")["worker_id"].(string)

		p = e.do(e.admin, "GET", api+"/rooms/room1/workers", nil).want(200).page()
		ids := map[any]bool{}
		for _, id := range p.field("id") {
			ids[id] = true
		}
		if p.Total != 3 || len(ids) != 3 || !ids[global] || !ids[r1a] || !ids[r1b] || ids[r2] {
			t.Fatalf("room1 workers %v (total %d), want %s %s %s", p.field("id"), p.Total, global, r1a, r1b)
		}
		p = e.do(e.admin, "GET", api+"/rooms/@global/workers", nil).want(200).page()
		if p.Total != 1 || p.Items[0]["id"] != global {
			t.Fatalf("@global workers %v, want [%s]", p.field("id"), global)
		}
	})
}

// test_router_worker.py: heartbeat is owner-only even for superusers; delete
// is owner or superuser.
func TestWorkerOwnership(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w := e.newWorker(e.alice)
		p := e.do(e.admin, "PATCH", api+"/workers/"+w, nil).problem(403, "forbidden")
		if p["detail"] != "Worker belongs to different user" {
			t.Fatalf("detail %v", p["detail"])
		}
		e.do(e.bob, "PATCH", api+"/workers/"+w, nil).problem(403, "forbidden")
		e.do(e.bob, "DELETE", api+"/workers/"+w, nil).problem(403, "forbidden")
		if n := e.total(api + "/workers"); n != 1 {
			t.Fatalf("forbidden delete removed the worker")
		}
		e.do(e.admin, "DELETE", api+"/workers/"+w, nil).want(204)
		if n := e.total(api + "/workers"); n != 0 {
			t.Fatalf("superuser delete left %d workers", n)
		}
	})
}

// test_resilience.py / test_client.py: once a worker is gone (deleted, or
// swept) its heartbeat and claim answer 404, the code that makes the Python
// SDK stop cleanly; the late completion of its failed task is refused (403:
// the caller no longer owns the worker holding it) and the task keeps the failure.
func TestDeletedWorkerAnswers404(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w := e.registerJob(e.alice, "room_1", "modifiers", "Job")["worker_id"].(string)
		id := e.submit(e.alice, "room_1", "room_1:modifiers:Job", nil)
		e.claim(e.alice, w)
		e.patch(e.alice, id, "running").want(200)

		e.do(e.alice, "DELETE", api+"/workers/"+w, nil).want(204)

		e.do(e.alice, "PATCH", api+"/workers/"+w, nil).problem(404, "worker-not-found")
		p := e.do(e.alice, "POST", api+"/tasks/claim", map[string]any{"worker_id": w}).problem(404, "worker-not-found")
		if p["detail"] != "Worker "+w+" not found" {
			t.Fatalf("claim detail %v", p["detail"])
		}
		e.patch(e.alice, id, "completed").problem(403, "forbidden")
		if got := e.getTask(id); got["status"] != "failed" {
			t.Fatalf("task %v, want failed", got)
		}
	})
}
