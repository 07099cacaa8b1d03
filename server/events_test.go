package server_test

import (
	"testing"
)

// --- test_router_events.py, with the bus recorder standing in for tsio.

// wantOnly fails unless ems are exactly the given (name, room) pairs, in any order.
func wantOnly(t *testing.T, ems []emitted, want ...[2]string) {
	t.Helper()
	left := map[[2]string]int{}
	for _, w := range want {
		left[w]++
	}
	for _, em := range ems {
		k := [2]string{em.Name, em.Room}
		if left[k] == 0 {
			t.Fatalf("unexpected emission %v; got %v, want %v", em, ems, want)
		}
		left[k]--
	}
	for k, n := range left {
		if n > 0 {
			t.Fatalf("missing emission %v; got %v", k, ems)
		}
	}
}

// Registration (new, idempotent, reactivation) emits one jobs_invalidate
// with an empty payload to the path room.
func TestRegisterJobEmitsJobsInvalidate(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w := e.seed()
		ems := e.emissions()
		wantOnly(t, ems, [2]string{"jobs_invalidate", "room:@global"})
		if len(ems[0].Payload) != 0 {
			t.Fatalf("jobs_invalidate payload %v, want {}", ems[0].Payload)
		}
		e.registerJob(e.admin, "@global", "modifiers", "Rotate", map[string]any{"worker_id": w})
		wantOnly(t, e.emissions(), [2]string{"jobs_invalidate", "room:@global"})
		e.registerJob(e.alice, "room_7", "analysis", "RDF")
		wantOnly(t, e.emissions(), [2]string{"jobs_invalidate", "room:room_7"})
	})
}

// Submitting emits exactly one task_available to the job's worker room and
// one task_status_event (pending, with its queue position) to the target
// room, with the contract's payload fields, nulls included.
func TestSubmitEmits(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		e.seed()
		e.emissions()
		id := e.submit(e.alice, "test-room", rotate, map[string]any{"a": 1})
		ems := e.emissions()
		wantOnly(t, ems, [2]string{"task_available", "jobs:" + rotate}, [2]string{"task_status_event", "room:test-room"})

		av := named(ems, "task_available")[0].Payload
		wantKeys(t, "task_available", av, "job_name", "room_id", "task_id")
		if av["job_name"] != rotate || av["room_id"] != "test-room" || av["task_id"] != id {
			t.Fatalf("task_available %v", av)
		}
		st := named(ems, "task_status_event")[0].Payload
		wantKeys(t, "task_status_event", st, taskStatusFields...)
		if st["id"] != id || st["name"] != rotate || st["room_id"] != "test-room" || st["status"] != "pending" || st["queue_position"] != 1.0 {
			t.Fatalf("task_status_event %v", st)
		}
		wantTime(t, "created_at", st["created_at"])
		for _, k := range []string{"started_at", "completed_at", "worker_id", "error"} {
			if st[k] != nil {
				t.Fatalf("%s = %v, want null", k, st[k])
			}
		}
	})
}

// A claim emits exactly one task_status_event (claimed, worker set, no
// queue position) to the task's room; PATCH running one more with started_at.
func TestClaimAndUpdateEmitTaskStatus(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w := e.seed()
		id := e.submit(e.admin, "test-room", rotate, nil)
		e.emissions()

		e.claim(e.admin, w)
		ems := e.emissions()
		wantOnly(t, ems, [2]string{"task_status_event", "room:test-room"})
		st := ems[0].Payload
		wantKeys(t, "task_status_event", st, taskStatusFields...)
		if st["id"] != id || st["status"] != "claimed" || st["worker_id"] != w || st["queue_position"] != nil {
			t.Fatalf("claim event %v", st)
		}

		e.patch(e.admin, id, "running").want(200)
		ems = e.emissions()
		wantOnly(t, ems, [2]string{"task_status_event", "room:test-room"})
		if st = ems[0].Payload; st["status"] != "running" {
			t.Fatalf("running event %v", st)
		}
		wantTime(t, "started_at", st["started_at"])

		e.do(e.admin, "PATCH", api+"/tasks/"+id, map[string]any{"status": "failed", "error": "bad"}).want(200)
		ems = e.emissions()
		wantOnly(t, ems, [2]string{"task_status_event", "room:test-room"})
		if st = ems[0].Payload; st["status"] != "failed" || st["error"] != "bad" {
			t.Fatalf("failed event %v", st)
		}
		wantTime(t, "completed_at", st["completed_at"])
	})
}

// Deleting a worker that holds a claimed task emits the failed
// task_status_event (old worker id, no position) and jobs_invalidate to the
// job's room once, however many of its jobs live there.
func TestDeleteWorkerEmits(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w := e.seed()
		e.registerJob(e.admin, "@global", "modifiers", "Scale", map[string]any{"worker_id": w})
		id := e.submit(e.admin, "room1", rotate, nil)
		e.claim(e.admin, w)
		e.emissions()

		e.do(e.admin, "DELETE", api+"/workers/"+w, nil).want(204)
		ems := e.emissions()
		wantOnly(t, ems, [2]string{"task_status_event", "room:room1"}, [2]string{"jobs_invalidate", "room:@global"})
		st := named(ems, "task_status_event")[0].Payload
		if st["id"] != id || st["status"] != "failed" || st["worker_id"] != w || st["queue_position"] != nil || st["error"] != "Worker disconnected" {
			t.Fatalf("cleanup event %v", st)
		}
	})
}

// A worker leaving a job that another worker still serves still invalidates
// the job list (its worker count changed).
func TestDeleteWorkerEmitsWhenJobHasOtherWorkers(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w1 := e.seed()
		e.registerJob(e.admin, "@global", "modifiers", "Rotate")
		e.emissions()
		e.do(e.admin, "DELETE", api+"/workers/"+w1, nil).want(204)
		wantOnly(t, e.emissions(), [2]string{"jobs_invalidate", "room:@global"})
		e.do(e.admin, "GET", api+"/rooms/@global/jobs/"+rotate, nil).want(200)
	})
}

// The orphan rule's jobs_invalidate: with the worker gone, cancelling one of
// two pending tasks keeps the job (only the task event); cancelling the last
// soft-deletes it and invalidates its room.
func TestCancelLastPendingTaskEmitsOrphanInvalidate(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w := e.seed()
		a := e.submit(e.admin, "test-room", rotate, nil)
		b := e.submit(e.admin, "test-room", rotate, nil)
		e.do(e.admin, "DELETE", api+"/workers/"+w, nil).want(204)
		e.emissions()

		e.patch(e.admin, a, "cancelled").want(200)
		wantOnly(t, e.emissions(), [2]string{"task_status_event", "room:test-room"})
		e.do(e.admin, "GET", api+"/rooms/@global/jobs/"+rotate, nil).want(200)

		e.patch(e.admin, b, "cancelled").want(200)
		wantOnly(t, e.emissions(), [2]string{"task_status_event", "room:test-room"}, [2]string{"jobs_invalidate", "room:@global"})
		e.do(e.admin, "GET", api+"/rooms/@global/jobs/"+rotate, nil).problem(404, "job-not-found")
	})
}

// Reads, worker creation, heartbeats and every refused request emit nothing.
func TestQuietRequestsEmitNothing(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w := e.seed()
		id := e.submit(e.admin, "room", rotate, nil)
		e.emissions()
		quiet := []func(){
			func() { e.newWorker(e.alice) },
			func() { e.do(e.admin, "PATCH", api+"/workers/"+w, nil).want(200) },
			func() { e.do(e.admin, "GET", api+"/workers", nil).want(200) },
			func() { e.do(e.admin, "GET", api+"/rooms/room/jobs", nil).want(200) },
			func() { e.do(e.admin, "GET", api+"/rooms/room/jobs/"+rotate, nil).want(200) },
			func() { e.do(e.admin, "GET", api+"/rooms/room/jobs/"+rotate+"/tasks", nil).want(200) },
			func() { e.do(e.admin, "GET", api+"/rooms/room/workers", nil).want(200) },
			func() { e.do(e.admin, "GET", api+"/rooms/room/tasks", nil).want(200) },
			func() { e.do(e.admin, "GET", api+"/tasks/"+id, nil).want(200) },
			func() { e.patch(e.admin, id, "completed").want(409) },
			func() { e.patch(e.bob, id, "cancelled").want(403) },
			func() {
				e.do(e.admin, "PUT", api+"/rooms/@global/jobs", map[string]any{"category": "modifiers", "name": "Rotate", "schema": map[string]any{"x": 1}}).want(409)
			},
			func() {
				e.do(e.alice, "PUT", api+"/rooms/@global/jobs", map[string]any{"category": "modifiers", "name": "N"}).want(403)
			},
			func() { e.do(e.alice, "POST", api+"/tasks/claim", map[string]any{"worker_id": w}).want(403) },
			func() {
				e.do(e.alice, "POST", api+"/rooms/room/tasks/@global:modifiers:Nope", map[string]any{}).want(404)
			},
		}
		for i, f := range quiet {
			f()
			if ems := e.emissions(); len(ems) != 0 {
				t.Fatalf("request %d emitted %v", i, ems)
			}
		}
	})
}
