package server_test

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/zndraw/joblib/joblib"
)

// A job's worker-loss policy is its creator's: another user linking a worker
// with the same policy (or none) is fine, a different one is 409; the
// creator and superusers change it, and each change is audited.
func TestJobPolicyBelongsToCreator(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		requeue := map[string]any{"on_worker_loss": "requeue", "max_attempts": 3}
		e.registerJob(e.alice, "room", "modifiers", "Job", requeue)
		// Bob links workers: omitting the policy or repeating it is fine.
		e.registerJob(e.bob, "room", "modifiers", "Job")
		e.registerJob(e.bob, "room", "modifiers", "Job", requeue)
		for _, other := range []map[string]any{
			{"on_worker_loss": "fail"},
			{"on_worker_loss": "requeue", "max_attempts": 100},
		} {
			body := map[string]any{"category": "modifiers", "name": "Job", "schema": map[string]any{}}
			for k, v := range other {
				body[k] = v
			}
			p := e.do(e.bob, "PUT", api+"/rooms/room/jobs", body).problem(409, "policy-conflict")
			if !strings.Contains(p["detail"].(string), "on_worker_loss 'requeue' with max_attempts 3") {
				t.Fatalf("detail %v", p["detail"])
			}
		}
		job := e.do(e.bob, "GET", api+"/rooms/room/jobs/room:modifiers:Job", nil).want(200).M()
		if job["on_worker_loss"] != nil && job["on_worker_loss"] != "requeue" {
			t.Fatalf("policy changed: %v", job)
		}
		// The creator changes it, then a superuser does.
		e.registerJob(e.alice, "room", "modifiers", "Job", map[string]any{"on_worker_loss": "requeue", "max_attempts": 5})
		e.registerJob(e.admin, "room", "modifiers", "Job", map[string]any{"on_worker_loss": "fail"})
		e.do(e.alice, "PUT", api+"/rooms/room/jobs", map[string]any{"category": "modifiers", "name": "Job", "schema": map[string]any{}, "on_worker_loss": "fail"}).want(200)

		al, err := e.svc.ListAudit(context.Background(), joblib.AuditJobPolicy, 10)
		if err != nil || len(al) != 2 || al[0].Actor != "user:admin" || al[1].Actor != "user:alice" {
			t.Fatalf("audit %v %+v", err, al)
		}
		if !strings.Contains(string(al[1].Detail), `"max_attempts":5`) || !strings.Contains(string(al[1].Detail), `"max_attempts":3`) {
			t.Fatalf("audit detail %s", al[1].Detail)
		}
	})
}

// PATCH cannot make a task claimed or running without a worker (nothing
// would ever reap it); a superuser's change of a task no worker of theirs
// holds is audited.
func TestNoTransitionStrandsATask(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w := e.seed()
		id := e.submit(e.alice, "room", rotate, nil)
		p := e.patch(e.admin, id, "claimed").problem(409, "invalid-task-transition")
		if !strings.Contains(p["detail"].(string), "no worker") {
			t.Fatalf("detail %v", p["detail"])
		}
		e.patch(e.admin, id, "running").problem(409, "invalid-task-transition")
		if got := e.getTask(id); got["status"] != "pending" {
			t.Fatalf("task %v", got)
		}
		if c := e.claim(e.admin, w); c["id"] != id {
			t.Fatalf("claim %v", c)
		}
		e.patch(e.admin, id, "running").want(200) // admin's own worker: no audit
		other := e.submit(e.alice, "room", rotate, nil)
		e.patch(e.admin, other, "cancelled").want(200)
		al, _ := e.svc.ListAudit(context.Background(), joblib.AuditTaskStatus, 10)
		if len(al) != 1 || al[0].SubjectID.String() != other || !strings.Contains(string(al[0].Detail), `"to":"cancelled"`) {
			t.Fatalf("audit %+v", al)
		}
	})
}

// Every job and provider name registration accepts can be fetched, with the
// '/' raw or as %2F; names that could not be are refused with 422.
func TestRegisteredNamesAreFetchable(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		for _, name := range []string{"x/tasks", "a/tasks", "tasks/x/tasks", "a//b", "x/", "a/./b", "a/..", "./x/tasks"} {
			e.do(e.alice, "PUT", api+"/rooms/room/jobs", map[string]any{"category": "modifiers", "name": name}).problem(422, "validation-error")
		}
		for _, name := range []string{"x/info", "a//b", "b/"} {
			e.registerProvider(e.alice, "room", "data", name).problem(422, "validation-error")
		}
		e.registerProvider(e.alice, "room", "da:ta", "x").problem(422, "validation-error")

		names := []string{"tasks", "x/task", "x/tasksy", "a/b/c", "x y", "q?x#y", "ü/ñ", "/lead", "info", "x/info2"}
		esc := func(full string, slash bool) string {
			if slash {
				return url.PathEscape(full) // '/' as %2F
			}
			parts := strings.Split(full, "/")
			for i := range parts {
				parts[i] = url.PathEscape(parts[i])
			}
			return strings.Join(parts, "/")
		}
		for _, name := range names {
			e.registerJob(e.alice, "room", "modifiers", name)
			full := "room:modifiers:" + name
			for _, slash := range []bool{false, true} {
				got := e.do(e.alice, "GET", api+"/rooms/room/jobs/"+esc(full, slash), nil).want(200).M()
				if got["full_name"] != full {
					t.Fatalf("GET job %q (%%2F %v): %v", full, slash, got)
				}
				e.do(e.alice, "GET", api+"/rooms/room/jobs/"+esc(full, slash)+"/tasks", nil).want(200)
			}
			e.do(e.alice, "POST", api+"/rooms/room/tasks/"+esc(full, false), map[string]any{"payload": map[string]any{}}).want(202)
		}
		for _, name := range append(names, "x/tasks") {
			e.registerProvider(e.alice, "room", "data", name).want(201)
			full := "room:data:" + name
			for _, slash := range []bool{false, true} {
				got := e.do(e.alice, "GET", api+"/rooms/room/providers/"+esc(full, slash)+"/info", nil).want(200).M()
				if got["full_name"] != full {
					t.Fatalf("provider info %q: %v", full, got)
				}
			}
		}
	})
}

// A superuser deleting another user's worker or provider is audited; owners
// deleting their own are not.
func TestAdminDeletesAreAudited(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		mine := e.do(e.alice, "POST", api+"/workers", nil).want(201).M()["id"].(string)
		e.do(e.alice, "DELETE", api+"/workers/"+mine, nil).want(204)
		w := e.do(e.alice, "POST", api+"/workers", nil).want(201).M()["id"].(string)
		prov := e.provider(e.alice, "room", "data", "P", map[string]any{"worker_id": w})
		e.do(e.admin, "DELETE", api+"/providers/"+prov, nil).want(204)
		e.do(e.admin, "DELETE", api+"/workers/"+w, nil).want(204)
		wa, _ := e.svc.ListAudit(ctx, joblib.AuditWorkerDelete, 10)
		pa, _ := e.svc.ListAudit(ctx, joblib.AuditProviderDelete, 10)
		if len(wa) != 1 || wa[0].SubjectID.String() != w || wa[0].Actor != "user:admin" || len(pa) != 1 || pa[0].SubjectID.String() != prov {
			t.Fatalf("audit %+v %+v", wa, pa)
		}
	})
}
