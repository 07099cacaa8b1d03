package server_test

import (
	"testing"

	"github.com/google/uuid"
)

// --- test_router_task_submit.py

// Submitting answers 202 with Location and Retry-After: 1 and the pending
// task, its payload and target room echoed.
func TestSubmitTask(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		e.seed()
		r := e.do(e.alice, "POST", api+"/rooms/test-room/tasks/"+rotate, map[string]any{"payload": map[string]any{"angle": 90}}).want(202)
		task := r.M()
		wantHasKeys(t, "task", task, taskFields...)
		id := task["id"].(string)
		if _, err := uuid.Parse(id); err != nil {
			t.Fatalf("id %q", id)
		}
		if loc := r.Header.Get("Location"); loc != "/v1/joblib/tasks/"+id {
			t.Fatalf("Location %q", loc)
		}
		if ra := r.Header.Get("Retry-After"); ra != "1" {
			t.Fatalf("Retry-After %q", ra)
		}
		if task["status"] != "pending" || task["room_id"] != "test-room" || task["job_name"] != rotate ||
			task["payload"].(map[string]any)["angle"] != 90.0 || task["queue_position"] != 1.0 {
			t.Fatalf("task %v", task)
		}
		wantTime(t, "created_at", task["created_at"])
		for _, k := range []string{"started_at", "completed_at", "worker_id", "error"} {
			if task[k] != nil {
				t.Fatalf("%s = %v, want null", k, task[k])
			}
		}
		// The Location resolves to the same task.
		if got := e.do(e.alice, "GET", r.Header.Get("Location"), nil).want(200).M(); got["id"] != id || got["status"] != "pending" {
			t.Fatalf("GET Location: %v", got)
		}
	})
}

// Unknown and malformed job names are 404 job-not-found with the contract's
// details, and create nothing.
func TestSubmitTaskJobNotFound(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		e.seed()
		cases := map[string]string{
			"@global:modifiers:Nope": "Job '@global:modifiers:Nope' not found",
			"noColons":               "Invalid job name format: noColons",
			"one:part":               "Invalid job name format: one:part",
		}
		for name, detail := range cases {
			p := e.do(e.alice, "POST", api+"/rooms/room/tasks/"+name, map[string]any{"payload": map[string]any{}}).problem(404, "job-not-found")
			if p["detail"] != detail {
				t.Fatalf("%s: detail %v, want %q", name, p["detail"], detail)
			}
		}
		if n := e.total(api + "/rooms/room/tasks"); n != 0 {
			t.Fatalf("%d tasks created", n)
		}
	})
}

// Submitting to an @internal job without an executor is 503
// internal-job-not-configured and persists nothing (no task, no event).
func TestSubmitInternalJobWithoutExecutor(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		e.registerJob(e.admin, "@internal", "modifiers", "Center")
		e.emissions()
		p := e.do(e.alice, "POST", api+"/rooms/test-room/tasks/@internal:modifiers:Center", map[string]any{"payload": map[string]any{"x": 1}}).problem(503, "internal-job-not-configured")
		if p["detail"] != "Internal job '@internal:modifiers:Center' is registered but no executor is available" || p["title"] != "Service Unavailable" {
			t.Fatalf("problem %v", p)
		}
		if n := e.total(api + "/rooms/test-room/tasks"); n != 0 {
			t.Fatalf("%d tasks persisted", n)
		}
		if n := e.total(api + "/rooms/test-room/jobs/@internal:modifiers:Center/tasks"); n != 0 {
			t.Fatalf("%d job tasks persisted", n)
		}
		if ems := e.emissions(); len(ems) != 0 {
			t.Fatalf("rejected submission emitted %v", ems)
		}
	})
}

// Cross-room submission is allowed (the task belongs to the target room), an
// empty body object gives an empty payload, and a job with no workers still
// takes tasks.
func TestSubmitTaskCrossRoomAndEmptyPayload(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		e.registerJob(e.alice, "room_A", "modifiers", "Job")
		task := e.do(e.bob, "POST", api+"/rooms/room_B/tasks/room_A:modifiers:Job", map[string]any{"payload": map[string]any{}}).want(202).M()
		if task["room_id"] != "room_B" || task["job_name"] != "room_A:modifiers:Job" {
			t.Fatalf("task %v", task)
		}
		task = e.do(e.bob, "POST", api+"/rooms/room_B/tasks/room_A:modifiers:Job", "{}").want(202).M()
		if p, ok := task["payload"].(map[string]any); !ok || len(p) != 0 {
			t.Fatalf("payload %v, want {}", task["payload"])
		}
		if n := e.total(api + "/rooms/room_B/tasks"); n != 2 {
			t.Fatalf("room_B tasks %d", n)
		}
		if n := e.total(api + "/rooms/room_A/tasks"); n != 0 {
			t.Fatalf("room_A tasks %d", n)
		}
	})
}

// --- test_router_task_claim.py, test_multi_worker.py

// Claiming with nothing pending is {"task": null}.
func TestClaimEmpty(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w := e.seed()
		r := e.do(e.admin, "POST", api+"/tasks/claim", map[string]any{"worker_id": w}).want(200)
		m := r.M()
		if v, ok := m["task"]; !ok || v != nil || len(m) != 1 {
			t.Fatalf("claim %s, want {\"task\": null}", r.Body)
		}
		// A worker without any job link gets null too.
		if c := e.claim(e.alice, e.newWorker(e.alice)); c != nil {
			t.Fatalf("unlinked worker claimed %v", c)
		}
	})
}

// Claims are FIFO, mark the task claimed for the worker, and leave
// started_at null; the claim is visible on GET.
func TestClaimOldestFirst(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w := e.seed()
		first := e.submit(e.admin, "room", rotate, map[string]any{"order": 1})
		second := e.submit(e.admin, "room", rotate, map[string]any{"order": 2})
		c := e.claim(e.admin, w)
		wantHasKeys(t, "claimed task", c, taskFields...)
		if c["id"] != first || c["status"] != "claimed" || c["worker_id"] != w || c["started_at"] != nil || c["queue_position"] != nil ||
			c["payload"].(map[string]any)["order"] != 1.0 {
			t.Fatalf("first claim %v", c)
		}
		if got := e.getTask(first); got["status"] != "claimed" || got["worker_id"] != w {
			t.Fatalf("GET after claim %v", got)
		}
		if got := e.getTask(second); got["queue_position"] != 1.0 {
			t.Fatalf("remaining task position %v, want 1", got["queue_position"])
		}
		if c := e.claim(e.admin, w); c["id"] != second {
			t.Fatalf("second claim %v", c)
		}
		if c := e.claim(e.admin, w); c != nil {
			t.Fatalf("third claim %v, want null", c)
		}
	})
}

// A worker only gets tasks of jobs it is registered for.
func TestClaimOnlyRegisteredJobs(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		wa := e.registerJob(e.alice, "room", "modifiers", "JobA")["worker_id"].(string)
		wb := e.registerJob(e.alice, "room", "modifiers", "JobB")["worker_id"].(string)
		id := e.submit(e.alice, "room", "room:modifiers:JobA", nil)
		if c := e.claim(e.alice, wb); c != nil {
			t.Fatalf("JobB's worker claimed %v", c)
		}
		if c := e.claim(e.alice, wa); c["id"] != id {
			t.Fatalf("JobA's worker claimed %v", c)
		}
	})
}

// test_multi_worker.py: claim needs a worker id (422), an unknown worker is
// 404, someone else's worker 403 even for a superuser.
func TestClaimWorkerChecks(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w := e.registerJob(e.alice, "room", "modifiers", "Job")["worker_id"].(string)
		e.submit(e.alice, "room", "room:modifiers:Job", nil)
		e.do(e.alice, "POST", api+"/tasks/claim", map[string]any{}).problem(422, "validation-error")
		unknown := uuid.NewString()
		p := e.do(e.alice, "POST", api+"/tasks/claim", map[string]any{"worker_id": unknown}).problem(404, "worker-not-found")
		if p["detail"] != "Worker "+unknown+" not found" {
			t.Fatalf("detail %v", p["detail"])
		}
		for _, tok := range []string{e.bob, e.admin} {
			p = e.do(tok, "POST", api+"/tasks/claim", map[string]any{"worker_id": w}).problem(403, "forbidden")
			if p["detail"] != "Worker belongs to a different user" {
				t.Fatalf("detail %v", p["detail"])
			}
		}
		if n := e.total(api + "/rooms/room/tasks?status=pending"); n != 1 {
			t.Fatalf("refused claims changed the task: %d pending", n)
		}
	})
}

// test_multi_worker.py: two workers of one user share a job: FIFO across
// workers, each completes its own task, and the job survives the first
// completion because the other worker is still linked.
func TestTwoWorkersShareJob(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w1, w2 := e.newWorker(e.alice), e.newWorker(e.alice)
		e.do(e.alice, "PUT", api+"/rooms/room/jobs", map[string]any{"category": "modifiers", "name": "Job", "worker_id": w1}).want(201)
		e.do(e.alice, "PUT", api+"/rooms/room/jobs", map[string]any{"category": "modifiers", "name": "Job", "worker_id": w2}).want(200)
		t0 := e.submit(e.bob, "room", "room:modifiers:Job", map[string]any{"index": 0})
		t1 := e.submit(e.bob, "room", "room:modifiers:Job", map[string]any{"index": 1})
		c1, c2 := e.claim(e.alice, w1), e.claim(e.alice, w2)
		if c1["id"] != t0 || c1["worker_id"] != w1 || c2["id"] != t1 || c2["worker_id"] != w2 {
			t.Fatalf("claims %v / %v", c1, c2)
		}
		for _, id := range []string{t0, t1} {
			e.patch(e.alice, id, "running").want(200)
			e.patch(e.alice, id, "completed").want(200)
		}
		e.do(e.bob, "GET", api+"/rooms/room/jobs/room:modifiers:Job", nil).want(200)
	})
}

// --- test_client.py (server side of the SDK's calls)

// The calls the SDK makes, one manager = one worker: register two jobs with
// the adopted worker id, submit, claim until empty, start, complete, fail
// with an error, cancel from claimed and from running, heartbeat, and
// disconnect (after which the heartbeat is 404).
func TestSDKWorkflow(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		schema := map[string]any{"properties": map[string]any{"angle": map[string]any{"type": "number"}, "axis": map[string]any{"type": "string"}}}
		w := e.registerJob(e.admin, "@global", "modifiers", "Rotate", map[string]any{"schema": schema})["worker_id"].(string)
		j := e.registerJob(e.admin, "@global", "analysis", "Meta", map[string]any{"worker_id": w})
		if ws := j["workers"].([]any); len(ws) != 1 || ws[0] != w || j["worker_id"] != w {
			t.Fatalf("second registration %v, want worker %s", j, w)
		}
		got := e.do(e.admin, "GET", api+"/rooms/@global/jobs/"+rotate, nil).want(200).M()
		props := got["schema"].(map[string]any)["properties"].(map[string]any)
		if _, ok := props["angle"]; !ok {
			t.Fatalf("schema %v", got["schema"])
		}
		if _, ok := props["axis"]; !ok {
			t.Fatalf("schema %v", got["schema"])
		}

		ids := []string{
			e.submit(e.admin, "room_1", rotate, map[string]any{"angle": 45}),
			e.submit(e.admin, "submit_room", "@global:analysis:Meta", map[string]any{"value": 42}),
			e.submit(e.admin, "room_1", rotate, map[string]any{"angle": 1}),
			e.submit(e.admin, "room_1", rotate, map[string]any{"angle": 2}),
		}
		if got := e.getTask(ids[1]); got["status"] != "pending" || got["room_id"] != "submit_room" || got["job_name"] != "@global:analysis:Meta" ||
			got["payload"].(map[string]any)["value"] != 42.0 {
			t.Fatalf("submitted task %v", got)
		}
		var claimed []map[string]any
		for range ids {
			c := e.claim(e.admin, w)
			if c == nil {
				t.Fatalf("claim %d returned null with tasks pending", len(claimed)+1)
			}
			claimed = append(claimed, c)
		}
		if c := e.claim(e.admin, w); c != nil {
			t.Fatalf("claim after the queue drained: %v", c)
		}
		if c := claimed[0]; c["id"] != ids[0] || c["room_id"] != "room_1" || c["job_name"] != rotate || c["payload"].(map[string]any)["angle"] != 45.0 {
			t.Fatalf("claimed metadata %v", c)
		}

		// start → running with started_at; complete → completed_at
		r := e.patch(e.admin, ids[0], "running").want(200).M()
		if r["status"] != "running" {
			t.Fatalf("start %v", r)
		}
		wantTime(t, "started_at", e.getTask(ids[0])["started_at"])
		r = e.patch(e.admin, ids[0], "completed").want(200).M()
		if r["status"] != "completed" || r["error"] != nil {
			t.Fatalf("complete %v", r)
		}
		wantTime(t, "completed_at", r["completed_at"])

		// fail with an error message
		e.patch(e.admin, ids[1], "running").want(200)
		r = e.do(e.admin, "PATCH", api+"/tasks/"+ids[1], map[string]any{"status": "failed", "error": "something broke"}).want(200).M()
		if r["status"] != "failed" || r["error"] != "something broke" {
			t.Fatalf("fail %v", r)
		}
		wantTime(t, "completed_at", r["completed_at"])

		// cancel from claimed and from running
		r = e.patch(e.admin, ids[2], "cancelled").want(200).M()
		wantTime(t, "completed_at", r["completed_at"])
		e.patch(e.admin, ids[3], "running").want(200)
		if r = e.patch(e.admin, ids[3], "cancelled").want(200).M(); r["status"] != "cancelled" {
			t.Fatalf("cancel from running %v", r)
		}

		e.do(e.admin, "PATCH", api+"/workers/"+w, nil).want(200)
		e.do(e.admin, "DELETE", api+"/workers/"+w, nil).want(204)
		e.do(e.admin, "PATCH", api+"/workers/"+w, nil).problem(404, "worker-not-found")
	})
}

// test_client.py: register() in each category creates @global:<cat>:Name,
// listed under @global; a room registration is listed under its room.
func TestSDKRegisterCategories(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		for _, cat := range []string{"modifiers", "selections", "analysis"} {
			e.registerJob(e.admin, "@global", cat, "TestExt")
		}
		e.registerJob(e.admin, "my_room", "modifiers", "PrivateJob")
		got := map[any]bool{}
		for _, n := range e.do(e.admin, "GET", api+"/rooms/@global/jobs", nil).want(200).page().field("full_name") {
			got[n] = true
		}
		for _, cat := range []string{"modifiers", "selections", "analysis"} {
			if !got["@global:"+cat+":TestExt"] {
				t.Fatalf("@global listing %v lacks %s", got, cat)
			}
		}
		if got["my_room:modifiers:PrivateJob"] {
			t.Fatal("room job listed under @global")
		}
		found := false
		for _, n := range e.do(e.admin, "GET", api+"/rooms/my_room/jobs", nil).want(200).page().field("full_name") {
			found = found || n == "my_room:modifiers:PrivateJob"
		}
		if !found {
			t.Fatal("room job not listed under its room")
		}
	})
}
