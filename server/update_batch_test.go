package server_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zndraw/joblib/joblib"
)

// batchItems decodes the results of a batch update (HTTP body or socket ack).
func batchItems(t *testing.T, m map[string]any) []map[string]any {
	t.Helper()
	raw, ok := m["results"].([]any)
	if !ok {
		t.Fatalf("no results in %v", m)
	}
	out := make([]map[string]any, len(raw))
	for i, r := range raw {
		out[i] = r.(map[string]any)
	}
	return out
}

// wantItem checks one result: the task in status, or the problem of status
// code and slug (status given as "409 invalid-task-transition").
func wantItem(t *testing.T, it map[string]any, taskID, want string) {
	t.Helper()
	if it["task_id"] != taskID {
		t.Fatalf("result for %v, want %s: %v", it["task_id"], taskID, it)
	}
	code, slug, isProblem := strings.Cut(want, " ")
	if !isProblem {
		task, _ := it["task"].(map[string]any)
		if task == nil || task["id"] != taskID || task["status"] != want || it["problem"] != nil {
			t.Fatalf("result %v, want the task %s", it, want)
		}
		wantKeys(t, "batch result task", task, append(taskFields, taskFieldsBeyond...)...)
		return
	}
	p, _ := it["problem"].(map[string]any)
	if p == nil || it["task"] != nil || fmt.Sprint(p["status"]) != code || p["type"] != "/v1/problems/"+slug {
		t.Fatalf("result %v, want problem %s", it, want)
	}
}

// A batch update answers each report as PATCH /tasks/{id} would, in the
// order of the reports, applies the accepted ones whatever the others say,
// stores results, and publishes one task_status_event per change; the batch
// as a whole is refused only for its shape.
func TestBatchUpdateOutcomes(t *testing.T) {
	t.Parallel()
	eachWith(t, []func(*setupOpts){withRealtime(realtimeCfg())}, func(t *testing.T, e *env) {
		wid := e.registerJob(e.alice, "bu", "modifiers", "Job")["worker_id"].(string)
		bobW := e.registerJob(e.bob, "bu", "modifiers", "Other")["worker_id"].(string)
		var ids []string
		for range 4 {
			ids = append(ids, e.submit(e.bob, "bu", "bu:modifiers:Job", nil))
		}
		bobs := e.submit(e.bob, "bu", "bu:modifiers:Other", nil)
		pending := e.submit(e.bob, "bu", "bu:modifiers:Job", nil)
		for _, id := range ids {
			if c := e.claim(e.alice, wid); c["id"] != id {
				t.Fatalf("claimed %v, want %s", c["id"], id)
			}
		}
		if c := e.claim(e.bob, bobW); c["id"] != bobs {
			t.Fatalf("bob claimed %v", c)
		}
		e.patch(e.alice, ids[1], "running").want(200)
		e.emissions()

		missing := "00000000-0000-0000-0000-0000000000aa"
		path := api + "/tasks/update-batch"
		res := e.do(e.alice, "POST", path, map[string]any{"updates": []map[string]any{
			{"task_id": ids[0], "status": "running"},
			{"task_id": ids[1], "status": "completed", "result": map[string]any{"answer": 42, "ü": "<&>"}},
			{"task_id": ids[2], "status": "completed"}, // claimed → completed skips running
			{"task_id": ids[3], "status": "failed", "error": "boom"},
			{"task_id": bobs, "status": "running"},
			{"task_id": missing, "status": "running"},
			{"task_id": pending, "status": "bogus"},
		}}).want(200).M()
		items := batchItems(t, res)
		if len(items) != 7 {
			t.Fatalf("%d results, want 7", len(items))
		}
		wantItem(t, items[0], ids[0], "running")
		wantItem(t, items[1], ids[1], "completed")
		wantItem(t, items[2], ids[2], "409 invalid-task-transition")
		wantItem(t, items[3], ids[3], "failed")
		wantItem(t, items[4], bobs, "403 forbidden")
		wantItem(t, items[5], missing, "404 task-not-found")
		wantItem(t, items[6], pending, "422 validation-error")

		if got := e.getTask(ids[1]); got["status"] != "completed" || fmt.Sprint(got["result"]) != "map[answer:42 ü:<&>]" {
			t.Fatalf("completed task %v: result not stored", got)
		}
		if got := e.getTask(ids[3]); got["status"] != "failed" || got["error"] != "boom" || got["completed_at"] == nil {
			t.Fatalf("failed task %v", got)
		}
		if got := e.getTask(ids[0]); got["status"] != "running" || got["started_at"] == nil {
			t.Fatalf("running task %v", got)
		}
		for _, id := range []string{ids[2], bobs} {
			if got := e.getTask(id); got["status"] != "claimed" {
				t.Fatalf("refused report changed task %v", got)
			}
		}
		ems := named(e.emissions(), "task_status_event")
		byTask := map[string][]string{}
		for _, em := range ems {
			wantKeys(t, "task_status_event", em.Payload, taskStatusFields...)
			byTask[em.Payload["id"].(string)] = append(byTask[em.Payload["id"].(string)], em.Payload["status"].(string))
		}
		want := map[string][]string{ids[0]: {"running"}, ids[1]: {"completed"}, ids[3]: {"failed"}}
		if fmt.Sprint(byTask) != fmt.Sprint(want) {
			t.Fatalf("task_status_event per task %v, want %v", byTask, want)
		}

		// The batch's shape.
		e.do(e.alice, "POST", path, map[string]any{"updates": []any{}}).problem(422, "validation-error")
		e.do(e.alice, "POST", path, map[string]any{}).problem(422, "validation-error")
		many := make([]map[string]any, joblib.MaxUpdateBatch+1)
		for i := range many {
			many[i] = map[string]any{"task_id": fmt.Sprintf("00000000-0000-0000-0000-%012d", i), "status": "running"}
		}
		e.do(e.alice, "POST", path, map[string]any{"updates": many}).problem(422, "validation-error")
		p := e.do(e.alice, "POST", path, map[string]any{"updates": []map[string]any{
			{"task_id": ids[0], "status": "completed"}, {"task_id": ids[0], "status": "failed"},
		}}).problem(422, "validation-error")
		if !strings.Contains(p["detail"].(string), "more than once") {
			t.Fatalf("duplicate detail %v", p["detail"])
		}
		e.do(e.alice, "POST", path, map[string]any{"updates": []map[string]any{{"status": "running"}}}).problem(422, "validation-error")
		e.do(e.alice, "POST", path, map[string]any{"updates": []any{"x"}}).problem(422, "validation-error")
		if p := e.do(e.alice, "POST", path, map[string]any{"updates": "x"}).problem(422, "validation-error"); p["detail"] != `field "updates" must be an array of {task_id, status, error?, result?}` {
			t.Fatalf("updates not an array: %v", p["detail"])
		}
		e.do("", "POST", path, map[string]any{"updates": []map[string]any{{"task_id": ids[0], "status": "completed"}}}).problem(401, "")
		if got := e.getTask(ids[0]); got["status"] != "running" {
			t.Fatalf("a refused batch changed %v", got)
		}

		// The same over a socket: update_tasks with an ack.
		w := mustDialSIO(t, e.url, e.alice)
		ack := w.call("update_tasks", map[string]any{"updates": []map[string]any{
			{"task_id": ids[0], "status": "completed", "result": []int{1, 2}},
			{"task_id": ids[1], "status": "running"},
		}})
		if ack["ok"] != true {
			t.Fatalf("update_tasks ack %v", ack)
		}
		items = batchItems(t, ack)
		wantItem(t, items[0], ids[0], "completed")
		wantItem(t, items[1], ids[1], "409 invalid-task-transition")
		if got := e.getTask(ids[0]); fmt.Sprint(got["result"]) != "[1 2]" {
			t.Fatalf("socket completion's result %v", got["result"])
		}
		for _, bad := range []map[string]any{{"updates": []any{}}, {"updates": 5}, {}} {
			if ack := w.call("update_tasks", bad); ack["ok"] == true || ack["status"] != float64(422) {
				t.Fatalf("socket batch %v: %v", bad, ack)
			}
		}
	})
}

// TestBatchUpdateRace: 8 workers claim batches over their sockets and report
// running then completed for each batch, half of them with POST
// /tasks/update-batch and half with update_tasks, and half of each half
// claiming with start (running at once, so they report only completed);
// meanwhile another user reports on the same tasks and is refused every
// time. Every task ends completed exactly once, by its claimer, with its
// result, and each change published exactly one task_status_event.
func TestBatchUpdateRace(t *testing.T) {
	t.Parallel()
	eachWith(t, []func(*setupOpts){withRealtime(realtimeCfg())}, func(t *testing.T, e *env) {
		const claimers, limit = 8, 6
		f := newRaceFixture(t, e, 2, 150, claimers)
		e.emissions()
		socks := make([]*sioClient, claimers)
		for c := range socks {
			socks[c] = mustDialSIO(t, e.url, e.alice)
		}
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: claimers + 1}}
		report := func(c int, ups []map[string]any) ([]map[string]any, error) {
			body := map[string]any{"updates": ups}
			var m map[string]any
			if c%2 == 0 {
				if err := postJSON(client, e.url+api+"/tasks/update-batch", e.alice, body, &m); err != nil {
					return nil, err
				}
			} else if m = socks[c].call("update_tasks", body); m["ok"] != true {
				return nil, fmt.Errorf("update_tasks ack %v", m)
			}
			raw, _ := m["results"].([]any)
			out := make([]map[string]any, len(raw))
			for i, r := range raw {
				out[i] = r.(map[string]any)
			}
			if len(out) != len(ups) {
				return nil, fmt.Errorf("%d results for %d reports: %v", len(out), len(ups), m)
			}
			return out, nil
		}
		claimedBy := make([][]string, claimers)
		var seenMu sync.Mutex
		seen := map[string]bool{}
		stop := make(chan struct{})
		var claimersDone, intruders sync.WaitGroup
		var refused, accepted int
		intruders.Go(func() {
			// Carol reports on whatever tasks have been claimed so far.
			carol := e.user("carol", false)
			for {
				select {
				case <-stop:
					return
				default:
				}
				seenMu.Lock()
				var ups []map[string]any
				for id := range seen {
					ups = append(ups, map[string]any{"task_id": id, "status": "failed", "error": "not yours"})
					if len(ups) == 10 {
						break
					}
				}
				seenMu.Unlock()
				if len(ups) == 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				var m map[string]any
				if err := postJSON(client, e.url+api+"/tasks/update-batch", carol, map[string]any{"updates": ups}, &m); err != nil {
					t.Error(err)
					return
				}
				for _, it := range m["results"].([]any) {
					if it.(map[string]any)["task"] != nil {
						accepted++
					} else {
						refused++
					}
				}
			}
		})
		errs := make([]error, claimers)
		start := make(chan struct{})
		for c := range claimers {
			claimersDone.Go(func() {
				<-start
				for {
					starts := c%4 >= 2
					raw, err := socketClaim(socks[c], map[string]any{"worker_id": f.workers[c], "limit": limit, "start": starts})
					if err != nil || len(raw) == 0 {
						errs[c] = err
						return
					}
					var running, done []map[string]any
					for _, r := range raw {
						id := r["id"].(string)
						if st := r["status"]; st != map[bool]string{false: "claimed", true: "running"}[starts] {
							errs[c] = fmt.Errorf("claimer %d (start %v) got a task in status %v", c, starts, st)
							return
						}
						claimedBy[c] = append(claimedBy[c], id)
						running = append(running, map[string]any{"task_id": id, "status": "running"})
						done = append(done, map[string]any{"task_id": id, "status": "completed", "result": map[string]any{"by": c}})
					}
					seenMu.Lock()
					for _, u := range running {
						seen[u["task_id"].(string)] = true
					}
					seenMu.Unlock()
					reports := [][]map[string]any{running, done}
					if starts {
						reports = reports[1:]
					}
					for _, ups := range reports {
						items, err := report(c, ups)
						if err != nil {
							errs[c] = err
							return
						}
						for i, it := range items {
							task, _ := it["task"].(map[string]any)
							if task == nil || task["id"] != ups[i]["task_id"] || task["status"] != ups[i]["status"] || task["worker_id"] != f.workers[c] {
								errs[c] = fmt.Errorf("claimer %d: report %v answered %v", c, ups[i], it)
								return
							}
						}
					}
				}
			})
		}
		close(start)
		claimersDone.Wait()
		close(stop)
		intruders.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if accepted != 0 || refused == 0 {
			t.Fatalf("another user's reports: %d accepted, %d refused", accepted, refused)
		}
		owner := map[string]int{}
		for c, ids := range claimedBy {
			for _, id := range ids {
				if prev, dup := owner[id]; dup {
					t.Fatalf("task %s claimed by %d and %d", id, prev, c)
				}
				owner[id] = c
			}
		}
		if len(owner) != f.tasks {
			t.Fatalf("%d tasks claimed, want %d", len(owner), f.tasks)
		}
		if n := e.total(api + "/rooms/batch/tasks?status=completed&limit=0"); n != f.tasks {
			t.Fatalf("%d tasks completed, want %d", n, f.tasks)
		}
		changes := map[string]string{}
		for _, em := range named(e.emissions(), "task_status_event") {
			id, st := em.Payload["id"].(string), em.Payload["status"].(string)
			changes[id] += st[:2]
		}
		for id, c := range owner {
			want := "clruco"
			if c%4 >= 2 {
				want = "ruco"
			}
			if changes[id] != want {
				t.Fatalf("task %s (claimer %d) published %q, want %q: each status once", id, c, changes[id], want)
			}
		}
		for _, id := range claimedBy[3][:3] {
			if got := e.getTask(id); fmt.Sprint(got["result"]) != "map[by:3]" {
				t.Fatalf("task %s result %v", id, got["result"])
			}
		}
	})
}

// A superuser's report on a task that no worker of theirs holds is audited,
// whichever path applies it (one PATCH, or a batch).
func TestOverrideOfAHeldTaskIsAudited(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		wid := e.registerJob(e.alice, "ov", "modifiers", "Job")["worker_id"].(string)
		a := e.submit(e.bob, "ov", "ov:modifiers:Job", nil)
		b := e.submit(e.bob, "ov", "ov:modifiers:Job", nil)
		e.claim(e.alice, wid)
		e.claim(e.alice, wid)
		e.patch(e.admin, a, "failed").want(200)
		res := e.do(e.admin, "POST", api+"/tasks/update-batch", map[string]any{"updates": []map[string]any{{"task_id": b, "status": "cancelled"}}}).want(200).M()
		wantItem(t, batchItems(t, res)[0], b, "cancelled")
		al, err := e.svc.ListAudit(context.Background(), joblib.AuditTaskStatus, 10)
		if err != nil || len(al) != 2 {
			t.Fatalf("audit %v %+v, want two overrides", err, al)
		}
		got := map[string]string{}
		for _, x := range al {
			got[x.SubjectID.String()] = string(x.Detail)
		}
		if !strings.Contains(got[a], `"to":"failed"`) || !strings.Contains(got[b], `"to":"cancelled"`) {
			t.Fatalf("audit %v", got)
		}
	})
}

// A claim with start hands out the tasks running (started, as a claim and a
// report of running would leave them) with one task_status_event each, over
// HTTP and over a socket, on both databases; the worker then completes them.
func TestClaimWithStart(t *testing.T) {
	t.Parallel()
	eachWith(t, []func(*setupOpts){withRealtime(realtimeCfg())}, func(t *testing.T, e *env) {
		wid := e.registerJob(e.alice, "cs", "modifiers", "Job")["worker_id"].(string)
		var ids []string
		for range 3 {
			ids = append(ids, e.submit(e.bob, "cs", "cs:modifiers:Job", nil))
		}
		e.emissions()
		got := e.do(e.alice, "POST", api+"/tasks/claim-batch", map[string]any{"worker_id": wid, "limit": 2, "start": true}).want(200).M()["tasks"].([]any)
		w := mustDialSIO(t, e.url, e.alice)
		ack := w.call("claim_tasks", map[string]any{"worker_id": wid, "limit": 5, "start": true})
		more, _ := ack["tasks"].([]any)
		if ack["ok"] != true || len(got) != 2 || len(more) != 1 {
			t.Fatalf("claims with start: %v and %v", got, ack)
		}
		for i, raw := range append(got, more...) {
			task := raw.(map[string]any)
			if task["id"] != ids[i] || task["status"] != "running" || task["worker_id"] != wid || task["started_at"] == nil {
				t.Fatalf("claimed with start: %v", task)
			}
		}
		ems := named(e.emissions(), "task_status_event")
		if len(ems) != 3 {
			t.Fatalf("%d task_status_events for 3 tasks claimed with start: %v", len(ems), ems)
		}
		for _, em := range ems {
			if em.Payload["status"] != "running" || em.Payload["started_at"] == nil {
				t.Fatalf("event %v", em)
			}
		}
		// Running means running: no second start, completion allowed.
		e.patch(e.alice, ids[0], "running").problem(409, "invalid-task-transition")
		res := e.do(e.alice, "POST", api+"/tasks/update-batch", map[string]any{"updates": []map[string]any{
			{"task_id": ids[0], "status": "completed"}, {"task_id": ids[2], "status": "completed"},
		}}).want(200).M()
		items := batchItems(t, res)
		wantItem(t, items[0], ids[0], "completed")
		wantItem(t, items[1], ids[2], "completed")
		if e.do(e.alice, "POST", api+"/tasks/claim-batch", map[string]any{"worker_id": wid, "start": "yes"}).Status != 422 {
			t.Fatal("start must be a boolean")
		}
	})
}
