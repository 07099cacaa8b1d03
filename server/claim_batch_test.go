package server_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
)

// claimed is one task as a batch claim returns it.
type claimedTask struct {
	ID       string `json:"id"`
	Status   string `json:"status"`
	WorkerID string `json:"worker_id"`
}

// raceFixture: jobs × perJob pending tasks in room "batch", submitted in order
// within each job, and one worker per claimer linked to every job.
type raceFixture struct {
	workers []string
	order   map[string]int // task id -> position within its job
	jobOf   map[string]int
	tasks   int
}

func newRaceFixture(t *testing.T, e *env, jobs, perJob, claimers int) *raceFixture {
	f := &raceFixture{order: map[string]int{}, jobOf: map[string]int{}, tasks: jobs * perJob}
	for range claimers {
		var wid any
		for j := range jobs {
			extra := map[string]any{}
			if wid != nil {
				extra["worker_id"] = wid
			}
			wid = e.registerJob(e.alice, "batch", "modifiers", fmt.Sprintf("Job%d", j), extra)["worker_id"]
		}
		f.workers = append(f.workers, wid.(string))
	}
	// One batch a job: the race is the claims', and a batch keeps its
	// order, as single submits one after another would.
	for j := range jobs {
		payloads := make([]map[string]any, perJob)
		for i := range payloads {
			payloads[i] = map[string]any{"i": i}
		}
		for i, id := range e.submitBatch(e.bob, "batch", fmt.Sprintf("batch:modifiers:Job%d", j), payloads) {
			f.order[id], f.jobOf[id] = i, j
		}
	}
	return f
}

// check verifies exact accounting: every task claimed exactly once, by the
// claimer's own worker, in FIFO order within each job for each claimer, no
// batch above the limit, and nothing left pending.
func (f *raceFixture) check(t *testing.T, e *env, limit int, batches [][][]claimedTask) {
	t.Helper()
	seen := map[string]int{}
	for c, bs := range batches {
		last := map[int]int{}
		for _, b := range bs {
			if len(b) > limit {
				t.Fatalf("claimer %d got a batch of %d, limit %d", c, len(b), limit)
			}
			for _, task := range b {
				if task.Status != "claimed" || task.WorkerID != f.workers[c] {
					t.Fatalf("claimer %d got %+v", c, task)
				}
				seen[task.ID]++
				j, pos := f.jobOf[task.ID], f.order[task.ID]
				if prev, ok := last[j]; ok && pos <= prev {
					t.Fatalf("claimer %d got job %d task #%d after #%d: FIFO broken", c, j, pos, prev)
				}
				last[j] = pos
			}
		}
	}
	if len(seen) != f.tasks {
		t.Fatalf("%d distinct tasks claimed, want %d", len(seen), f.tasks)
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("task %s claimed %d times", id, n)
		}
	}
	page := e.do(e.admin, "GET", api+"/rooms/batch/tasks?status=pending&limit=0", nil).want(200).M()
	if page["total"].(float64) != 0 {
		t.Fatalf("%v tasks still pending", page["total"])
	}
}

// TestBatchClaimRace: 12 workers each claim batches of up to 7 over HTTP,
// racing, until they get an empty batch; 600 tasks across 2 jobs are each
// claimed exactly once.
func TestBatchClaimRace(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		const claimers, limit = 12, 7
		f := newRaceFixture(t, e, 2, 300, claimers)
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: claimers}}
		batches := make([][][]claimedTask, claimers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for c := range claimers {
			wg.Go(func() {
				<-start
				for {
					var out struct {
						Tasks []claimedTask `json:"tasks"`
					}
					if err := postJSON(client, e.url+api+"/tasks/claim-batch", e.alice, map[string]any{"worker_id": f.workers[c], "limit": limit}, &out); err != nil {
						t.Error(err)
						return
					}
					if out.Tasks == nil {
						t.Error("batch claim answered without a tasks list")
						return
					}
					if len(out.Tasks) == 0 {
						return
					}
					batches[c] = append(batches[c], out.Tasks)
				}
			})
		}
		close(start)
		wg.Wait()
		if t.Failed() {
			return
		}
		f.check(t, e, limit, batches)
	})
}

// TestSocketClaimRace: 8 workers claim over their sockets (claim_tasks with an
// ack), batches of up to 5, racing; 400 tasks across 2 jobs are each claimed
// exactly once, with no HTTP claim at all.
func TestSocketClaimRace(t *testing.T) {
	t.Parallel()
	eachWith(t, []func(*setupOpts){withRealtime(realtimeCfg())}, func(t *testing.T, e *env) {
		const claimers, limit = 8, 5
		f := newRaceFixture(t, e, 2, 200, claimers)
		socks := make([]*sioClient, claimers)
		for c := range socks {
			socks[c] = mustDialSIO(t, e.url, e.alice)
		}
		batches := make([][][]claimedTask, claimers)
		errs := make([]error, claimers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for c := range claimers {
			wg.Go(func() {
				<-start
				for {
					raw, err := socketClaim(socks[c], map[string]any{"worker_id": f.workers[c], "limit": limit})
					if err != nil || len(raw) == 0 {
						errs[c] = err
						return
					}
					b := make([]claimedTask, len(raw))
					for i, m := range raw {
						b[i] = claimedTask{ID: m["id"].(string), Status: m["status"].(string)}
						b[i].WorkerID, _ = m["worker_id"].(string)
					}
					batches[c] = append(batches[c], b)
				}
			})
		}
		close(start)
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		f.check(t, e, limit, batches)
	})
}

// socketClaim sends claim_tasks and returns the tasks its ack carries (none:
// nothing was claimable).
func socketClaim(s *sioClient, body map[string]any) ([]map[string]any, error) {
	a := s.call("claim_tasks", body)
	raw, ok := a["tasks"].([]any)
	if a["ok"] != true || !ok {
		return nil, fmt.Errorf("claim_tasks ack %v", a)
	}
	out := make([]map[string]any, len(raw))
	for i, r := range raw {
		out[i] = r.(map[string]any)
	}
	return out, nil
}

// Batch claims answer like the single claim for bad input and for someone
// else's or a missing worker; an empty queue answers an empty list.
func TestBatchClaimChecks(t *testing.T) {
	t.Parallel()
	eachWith(t, []func(*setupOpts){withRealtime(realtimeCfg())}, func(t *testing.T, e *env) {
		wid := e.registerJob(e.alice, "bc", "modifiers", "Job")["worker_id"].(string)
		path := api + "/tasks/claim-batch"
		for _, limit := range []int{0, -1, 101} {
			e.do(e.alice, "POST", path, map[string]any{"worker_id": wid, "limit": limit}).problem(422, "validation-error")
		}
		e.do(e.alice, "POST", path, map[string]any{"limit": 3}).problem(422, "validation-error")
		e.do(e.bob, "POST", path, map[string]any{"worker_id": wid, "limit": 3}).problem(403, "forbidden")
		e.do(e.alice, "POST", path, map[string]any{"worker_id": "00000000-0000-0000-0000-000000000001", "limit": 3}).problem(404, "worker-not-found")
		if got := e.do(e.alice, "POST", path, map[string]any{"worker_id": wid, "limit": 3}).want(200).M(); len(got["tasks"].([]any)) != 0 {
			t.Fatalf("empty queue answered %v", got)
		}
		a := e.submit(e.bob, "bc", "bc:modifiers:Job", nil)
		b := e.submit(e.bob, "bc", "bc:modifiers:Job", nil)
		got := e.do(e.alice, "POST", path, map[string]any{"worker_id": wid}).want(200).M()["tasks"].([]any)
		if len(got) != 1 || got[0].(map[string]any)["id"] != a {
			t.Fatalf("default limit claimed %v, want only the oldest", got)
		}

		ui := mustDialSIO(t, e.url, e.bob)
		if ack := ui.call("claim_tasks", map[string]any{"worker_id": wid, "limit": 2}); ack["ok"] == true || ack["status"] != float64(403) {
			t.Fatalf("someone else's worker over a socket: %v", ack)
		}
		if ack := ui.call("claim_tasks", map[string]any{"worker_id": "nope"}); ack["status"] != float64(422) || ack["type"] != "/v1/problems/validation-error" {
			t.Fatalf("bad worker id over a socket: %v", ack)
		}
		w := mustDialSIO(t, e.url, e.alice)
		ack := w.call("claim_tasks", map[string]any{"worker_id": wid, "limit": 5})
		ts, _ := ack["tasks"].([]any)
		if ack["ok"] != true || len(ts) != 1 || ts[0].(map[string]any)["id"] != b {
			t.Fatalf("socket claim: %v", ack)
		}
	})
}
