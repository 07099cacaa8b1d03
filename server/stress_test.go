package server_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
)

// --- test_stress.py, with real concurrency: goroutines hitting the HTTP
// server at once (the Python fixture serialised every request).

// call is a goroutine-safe request: it never calls t.Fatal.
func (e *env) call(token, method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, e.url+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, b, err
}

// tryClaim claims for a worker from any goroutine: the task id, "" for null.
func (e *env) tryClaim(token, worker string) (string, error) {
	code, b, err := e.call(token, "POST", api+"/tasks/claim", map[string]any{"worker_id": worker})
	if err != nil {
		return "", err
	}
	if code != 200 {
		return "", fmt.Errorf("claim: %d %s", code, b)
	}
	var r struct {
		Task *struct {
			ID       string `json:"id"`
			Status   string `json:"status"`
			WorkerID string `json:"worker_id"`
		} `json:"task"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return "", err
	}
	if r.Task == nil {
		return "", nil
	}
	if r.Task.Status != "claimed" || r.Task.WorkerID != worker {
		return "", fmt.Errorf("claim returned %s", b)
	}
	return r.Task.ID, nil
}

// workers registers n workers of the caller on one job and returns their ids.
func (e *env) workersOn(token, room, name string, n int) []string {
	e.t.Helper()
	var ids []string
	for range n {
		w := e.newWorker(token)
		e.registerJob(token, room, "modifiers", name, map[string]any{"worker_id": w})
		ids = append(ids, w)
	}
	return ids
}

// claimed collects claimed ids from many goroutines and checks exactly-once.
type claimed struct {
	mu  sync.Mutex
	ids map[string]int
}

func (c *claimed) add(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ids == nil {
		c.ids = map[string]int{}
	}
	c.ids[id]++
}

func (c *claimed) check(t *testing.T, want int, submitted map[string]bool) {
	t.Helper()
	for id, n := range c.ids {
		if n != 1 {
			t.Errorf("task %s claimed %d times", id, n)
		}
		if submitted != nil && !submitted[id] {
			t.Errorf("claimed %s was never submitted", id)
		}
	}
	if len(c.ids) != want {
		t.Errorf("%d distinct tasks claimed, want %d", len(c.ids), want)
	}
}

// 100 concurrent submissions all answer 202 and all are listed.
func TestStressConcurrentSubmissions(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		e.seed()
		const n = 100
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				code, b, err := e.call(e.alice, "POST", api+"/rooms/stress/tasks/"+rotate, map[string]any{"payload": map[string]any{}})
				if err != nil || code != 202 {
					t.Errorf("submit: %d %s %v", code, b, err)
				}
			})
		}
		wg.Wait()
		p := e.do(e.alice, "GET", api+"/rooms/stress/tasks?limit=200", nil).want(200).page()
		if p.Total != n || len(p.Items) != n {
			t.Fatalf("listed %d of total %d, want %d", len(p.Items), p.Total, n)
		}
		// Queue positions are 1..n, each once.
		seen := map[float64]bool{}
		for _, pos := range p.field("queue_position") {
			seen[pos.(float64)] = true
		}
		for i := 1; i <= n; i++ {
			if !seen[float64(i)] {
				t.Fatalf("queue position %d missing", i)
			}
		}
	})
}

// 10 workers on one job drain 50 tasks concurrently, each claiming until it
// gets null (or 10 times): every task is claimed exactly once.
func TestStressConcurrentClaimsMultipleWorkers(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		ws := e.workersOn(e.alice, "stress", "Job", 10)
		for range 50 {
			e.submit(e.bob, "stress", "stress:modifiers:Job", nil)
		}
		var got claimed
		var wg sync.WaitGroup
		for _, w := range ws {
			wg.Go(func() {
				for range 10 {
					id, err := e.tryClaim(e.alice, w)
					if err != nil {
						t.Error(err)
						return
					}
					if id == "" {
						return
					}
					got.add(id)
				}
			})
		}
		wg.Wait()
		got.check(t, 50, nil)
		if n := e.total(api + "/rooms/stress/tasks?status=pending"); n != 0 {
			t.Fatalf("%d tasks still pending", n)
		}
		if n := e.total(api + "/rooms/stress/tasks?status=claimed"); n != 50 {
			t.Fatalf("%d tasks claimed in the database, want 50", n)
		}
	})
}

// 10 workers race for one task: exactly one wins.
func TestStressNoDoubleClaim(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		ws := e.workersOn(e.alice, "stress", "Job", 10)
		id := e.submit(e.bob, "stress", "stress:modifiers:Job", nil)
		var got claimed
		var wg sync.WaitGroup
		start := make(chan struct{})
		for _, w := range ws {
			wg.Go(func() {
				<-start
				tid, err := e.tryClaim(e.alice, w)
				if err != nil {
					t.Error(err)
				} else if tid != "" {
					got.add(tid)
				}
			})
		}
		close(start)
		wg.Wait()
		got.check(t, 1, map[string]bool{id: true})
	})
}

// Two submitters and five claimers run at once; afterwards the queue is
// drained: every submitted task was claimed exactly once, nothing else was.
func TestStressConcurrentSubmitAndClaim(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		ws := e.workersOn(e.alice, "stress", "Job", 5)
		var (
			mu        sync.Mutex
			submitted = map[string]bool{}
			got       claimed
			wg        sync.WaitGroup
		)
		for range 2 {
			wg.Go(func() {
				for range 30 {
					code, b, err := e.call(e.bob, "POST", api+"/rooms/stress/tasks/stress:modifiers:Job", map[string]any{"payload": map[string]any{}})
					if err != nil || code != 202 {
						t.Errorf("submit: %d %s %v", code, b, err)
						return
					}
					var task struct{ ID string }
					_ = json.Unmarshal(b, &task)
					mu.Lock()
					submitted[task.ID] = true
					mu.Unlock()
				}
			})
		}
		for _, w := range ws {
			wg.Go(func() {
				for range 20 {
					id, err := e.tryClaim(e.alice, w)
					if err != nil {
						t.Error(err)
						return
					}
					if id != "" {
						got.add(id)
					}
				}
			})
		}
		wg.Wait()
		for { // drain what the claimers left
			id, err := e.tryClaim(e.alice, ws[0])
			if err != nil {
				t.Fatal(err)
			}
			if id == "" {
				break
			}
			got.add(id)
		}
		got.check(t, 60, submitted)
		if len(submitted) != 60 {
			t.Fatalf("%d submitted", len(submitted))
		}
	})
}

// One worker fires 30 claims at once at 20 tasks: exactly 20 tasks and 10
// nulls, never the same task twice.
func TestStressRapidFireClaimsSameWorker(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w := e.workersOn(e.alice, "stress", "Job", 1)[0]
		for range 20 {
			e.submit(e.bob, "stress", "stress:modifiers:Job", nil)
		}
		var (
			got   claimed
			mu    sync.Mutex
			nulls int
			wg    sync.WaitGroup
		)
		start := make(chan struct{})
		for range 30 {
			wg.Go(func() {
				<-start
				id, err := e.tryClaim(e.alice, w)
				if err != nil {
					t.Error(err)
					return
				}
				if id == "" {
					mu.Lock()
					nulls++
					mu.Unlock()
					return
				}
				got.add(id)
			})
		}
		close(start)
		wg.Wait()
		got.check(t, 20, nil)
		if nulls != 10 {
			t.Fatalf("%d null claims, want 10", nulls)
		}
	})
}

// Ten concurrent PATCHes of one claimed task to running: exactly one wins,
// the others get 409.
func TestStressConcurrentTransition(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w := e.workersOn(e.alice, "stress", "Job", 1)[0]
		id := e.submit(e.bob, "stress", "stress:modifiers:Job", nil)
		e.claim(e.alice, w)
		codes := make([]int, 10)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range codes {
			wg.Go(func() {
				<-start
				code, b, err := e.call(e.alice, "PATCH", api+"/tasks/"+id, map[string]any{"status": "running"})
				if err != nil {
					t.Error(err)
				}
				if code != 200 && code != 409 {
					t.Errorf("PATCH: %d %s", code, b)
				}
				codes[i] = code
			})
		}
		close(start)
		wg.Wait()
		ok := 0
		for _, c := range codes {
			if c == 200 {
				ok++
			}
		}
		if ok != 1 {
			t.Fatalf("%d PATCHes succeeded, want 1 (%v)", ok, codes)
		}
	})
}

// A worker deleted while it claims never leaves a task claimed by a worker
// that no longer exists: each task ends either pending (the claim lost) or
// failed (the claim won and the cleanup failed it).
func TestStressClaimRacesWorkerDelete(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		const rounds = 15
		for i := range rounds {
			w := e.registerJob(e.alice, "race", "modifiers", "Job")["worker_id"].(string)
			id := e.submit(e.bob, "race", "race:modifiers:Job", nil)
			var wg sync.WaitGroup
			start := make(chan struct{})
			wg.Go(func() {
				<-start
				code, b, err := e.call(e.alice, "POST", api+"/tasks/claim", map[string]any{"worker_id": w})
				if err != nil || (code != 200 && code != 404) {
					t.Errorf("claim: %d %s %v", code, b, err)
				}
			})
			wg.Go(func() {
				<-start
				code, b, err := e.call(e.alice, "DELETE", api+"/workers/"+w, nil)
				if err != nil || code != 204 {
					t.Errorf("delete: %d %s %v", code, b, err)
				}
			})
			close(start)
			wg.Wait()
			task := e.getTask(id)
			switch task["status"] {
			case "pending":
			case "failed":
				if task["error"] != "Worker disconnected" {
					t.Fatalf("round %d: failed task %v", i, task)
				}
			default:
				t.Fatalf("round %d: task left %v by a deleted worker: %v", i, task["status"], task)
			}
			if task["status"] == "pending" {
				e.patch(e.admin, id, "cancelled").want(200)
			}
		}
	})
}

// The orphan rule never hides a job that a concurrent request just gave a
// reason to live: cancelling a job's last pending task (its worker gone)
// races a re-registration and a new submission. Whatever wins, a job with a
// linked worker or a pending task is visible, and a request that succeeded
// is reflected.
func TestStressOrphanRacesRegistrationAndSubmit(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		const rounds = 15
		job := api + "/rooms/orph/jobs/orph:modifiers:Job"
		for i := range rounds {
			w := e.registerJob(e.alice, "orph", "modifiers", "Job")["worker_id"].(string)
			last := e.submit(e.bob, "orph", "orph:modifiers:Job", nil)
			e.do(e.alice, "DELETE", api+"/workers/"+w, nil).want(204)

			var wg sync.WaitGroup
			start := make(chan struct{})
			var regCode, subCode int
			var regBody, subBody []byte
			wg.Go(func() {
				<-start
				code, b, err := e.call(e.admin, "PATCH", api+"/tasks/"+last, map[string]any{"status": "cancelled"})
				if err != nil || code != 200 {
					t.Errorf("cancel: %d %s %v", code, b, err)
				}
			})
			wg.Go(func() {
				<-start
				regCode, regBody, _ = e.call(e.alice, "PUT", api+"/rooms/orph/jobs", map[string]any{"category": "modifiers", "name": "Job"})
			})
			wg.Go(func() {
				<-start
				subCode, subBody, _ = e.call(e.bob, "POST", api+"/rooms/orph/tasks/orph:modifiers:Job", map[string]any{"payload": map[string]any{}})
			})
			close(start)
			wg.Wait()
			if regCode != 200 && regCode != 201 {
				t.Fatalf("round %d: registration %d %s", i, regCode, regBody)
			}
			if subCode != 202 && subCode != 404 {
				t.Fatalf("round %d: submission %d %s", i, subCode, subBody)
			}
			var reg struct {
				WorkerID string `json:"worker_id"`
			}
			_ = json.Unmarshal(regBody, &reg)
			r := e.do(e.admin, "GET", job, nil)
			if r.Status != 200 {
				t.Fatalf("round %d: the job was registered (%d, worker %s) but is gone: %d %s", i, regCode, reg.WorkerID, r.Status, r.Body)
			}
			if ws := r.M()["workers"].([]any); len(ws) != 1 || ws[0] != reg.WorkerID {
				t.Fatalf("round %d: workers %v, want [%s]", i, ws, reg.WorkerID)
			}
			// Reset: the new worker leaves, pending tasks are cancelled.
			e.do(e.alice, "DELETE", api+"/workers/"+reg.WorkerID, nil).want(204)
			for _, it := range e.do(e.admin, "GET", api+"/rooms/orph/tasks?status=pending", nil).want(200).page().Items {
				e.patch(e.admin, it["id"].(string), "cancelled").want(200)
			}
			e.do(e.admin, "GET", job, nil).problem(404, "job-not-found")
		}
	})
}

// A registration naming a worker races that worker's deletion: neither side
// ever fails with a server error (no deadlock between the worker's and the
// job's locks), and the end state follows the orphan rule: the worker is
// gone and so is the job it was the only worker of.
func TestStressRegistrationRacesWorkerDelete(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		const rounds = 15
		for i := range rounds {
			w := e.registerJob(e.alice, "reg", "modifiers", "A")["worker_id"].(string)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for _, name := range []string{"A", "B"} {
				wg.Go(func() {
					<-start
					code, b, err := e.call(e.alice, "PUT", api+"/rooms/reg/jobs", map[string]any{"category": "modifiers", "name": name, "worker_id": w})
					if err != nil || (code != 200 && code != 201 && code != 404) {
						t.Errorf("round %d: register %s: %d %s %v", i, name, code, b, err)
					}
				})
			}
			wg.Go(func() {
				<-start
				code, b, err := e.call(e.alice, "DELETE", api+"/workers/"+w, nil)
				if err != nil || code != 204 {
					t.Errorf("round %d: delete: %d %s %v", i, code, b, err)
				}
			})
			close(start)
			wg.Wait()
			if t.Failed() {
				return
			}
			for _, name := range []string{"A", "B"} {
				e.do(e.alice, "GET", api+"/rooms/reg/jobs/reg:modifiers:"+name, nil).problem(404, "job-not-found")
			}
			if n := e.total(api + "/workers"); n != 0 {
				t.Fatalf("round %d: %d workers left", i, n)
			}
		}
	})
}

// Concurrent deletes of one worker: exactly one 204, the others 404, and the
// cleanup (failing its claimed task) happens once.
func TestStressConcurrentWorkerDelete(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w := e.registerJob(e.alice, "del", "modifiers", "Job")["worker_id"].(string)
		id := e.submit(e.bob, "del", "del:modifiers:Job", nil)
		e.claim(e.alice, w)
		e.emissions()
		codes := make([]int, 8)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range codes {
			wg.Go(func() {
				<-start
				code, b, err := e.call(e.alice, "DELETE", api+"/workers/"+w, nil)
				if err != nil || (code != 204 && code != 404) {
					t.Errorf("delete: %d %s %v", code, b, err)
				}
				codes[i] = code
			})
		}
		close(start)
		wg.Wait()
		ok := 0
		for _, c := range codes {
			if c == 204 {
				ok++
			}
		}
		if ok != 1 {
			t.Fatalf("%d deletes answered 204, want 1 (%v)", ok, codes)
		}
		if n := len(named(e.emissions(), "task_status_event")); n != 1 {
			t.Fatalf("%d task_status_events, want 1", n)
		}
		if got := e.getTask(id); got["status"] != "failed" {
			t.Fatalf("task %v", got)
		}
	})
}
