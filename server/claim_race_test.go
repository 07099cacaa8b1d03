package server_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/server"
)

// TestClaimRace: 50 concurrent claimers on 500 tasks across 5 jobs. Exactly
// 500 claims succeed (so no claim answered null while an eligible task
// remained), every task is claimed exactly once, each claimer sees every job's
// tasks in FIFO order, and further claims answer null.
func TestClaimRace(t *testing.T) {
	t.Parallel()
	eachWith(t, claimRaceOpts(), func(t *testing.T, e *env) {
		const (
			jobs     = 5
			perJob   = 100
			claimers = 50
			tasks    = jobs * perJob
		)
		names := make([]string, jobs)
		for j := range names {
			names[j] = fmt.Sprintf("race:modifiers:Job%d", j)
		}
		// One worker per claimer, each linked to all five jobs.
		workers := make([]string, claimers)
		for c := range workers {
			var wid any
			for j := range jobs {
				extra := map[string]any{}
				if wid != nil {
					extra["worker_id"] = wid
				}
				wid = e.registerJob(e.alice, "race", "modifiers", fmt.Sprintf("Job%d", j), extra)["worker_id"]
			}
			workers[c] = wid.(string)
		}
		// Submit one batch a job, jobs in parallel: a batch keeps its order
		// (FIFO within the job).
		order := map[string]int{} // task id -> position within its job
		jobOf := map[string]int{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for j := range jobs {
			wg.Go(func() {
				payloads := make([]map[string]any, perJob)
				for i := range payloads {
					payloads[i] = map[string]any{"i": i}
				}
				ids := e.submitBatch(e.bob, "race", names[j], payloads)
				mu.Lock()
				for i, id := range ids {
					order[id], jobOf[id] = i, j
				}
				mu.Unlock()
			})
		}
		wg.Wait()

		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: claimers}}
		claimed := make([][]string, claimers)
		nulls := make([]int, claimers)
		start := make(chan struct{})
		for c := range claimers {
			wg.Go(func() {
				<-start
				for range tasks / claimers {
					id, err := claimOnce(client, e.url, e.alice, workers[c])
					if err != nil {
						t.Error(err)
						return
					}
					if id == "" {
						nulls[c]++
						continue
					}
					claimed[c] = append(claimed[c], id)
				}
			})
		}
		close(start)
		wg.Wait()

		seen := map[string]int{}
		total, totalNulls := 0, 0
		for c := range claimers {
			totalNulls += nulls[c]
			last := make([]int, jobs)
			for j := range last {
				last[j] = -1
			}
			for _, id := range claimed[c] {
				seen[id]++
				total++
				j, pos := jobOf[id], order[id]
				if pos <= last[j] {
					t.Fatalf("claimer %d got job %d task #%d after #%d: FIFO broken", c, j, pos, last[j])
				}
				last[j] = pos
			}
		}
		if total != tasks || totalNulls != 0 {
			t.Fatalf("claimed %d tasks with %d null answers, want %d and 0", total, totalNulls, tasks)
		}
		for id, n := range seen {
			if n != 1 {
				t.Fatalf("task %s claimed %d times", id, n)
			}
		}
		if len(seen) != tasks {
			t.Fatalf("%d distinct tasks claimed, want %d", len(seen), tasks)
		}
		for _, w := range workers[:5] {
			if got := e.claim(e.alice, w); got != nil {
				t.Fatalf("claim after drain returned %v", got["id"])
			}
		}
		page := e.do(e.admin, "GET", api+"/rooms/race/tasks?status=pending&limit=0", nil).want(200).M()
		if page["total"].(float64) != 0 {
			t.Fatalf("%v tasks still pending", page["total"])
		}
	})
}

// claimRaceOpts set up a claim race: one user submits every task as fast as
// it can (no rate limit), and the write budget is generous. The race is about
// accounting, not latency: on SQLite the claimers queue on its one
// connection, and under -race on a loaded machine a claim can wait past the
// default budget (a 503 the claimer would retry).
func claimRaceOpts() []func(*setupOpts) {
	unlimited := withSettings(func(s *joblib.Settings) { s.SubmitRate = 0 })
	cfg := server.DefaultConfig()
	cfg.WriteDBTimeout = 2 * time.Minute
	patient := func(o *setupOpts) { o.serverCfg = &cfg }
	return []func(*setupOpts){unlimited, patient}
}

func claimOnce(c *http.Client, base, token, worker string) (string, error) {
	var out struct {
		Task *struct {
			ID     string `json:"id"`
			Status string `json:"status"`
		} `json:"task"`
	}
	if err := postJSON(c, base+api+"/tasks/claim", token, map[string]any{"worker_id": worker}, &out); err != nil {
		return "", err
	}
	if out.Task == nil {
		return "", nil
	}
	if out.Task.Status != "claimed" {
		return "", fmt.Errorf("claimed task has status %q", out.Task.Status)
	}
	return out.Task.ID, nil
}

// TestLongPollWakesOnCompletion: GET /tasks/{id} with Prefer: wait=10 returns
// within 100 ms of the task's completion, with Preference-Applied.
func TestLongPollWakesOnCompletion(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		wid := e.registerJob(e.alice, "lp", "modifiers", "Slow")["worker_id"].(string)
		id := e.submit(e.alice, "lp", "lp:modifiers:Slow", nil)
		e.claim(e.alice, wid)
		e.patch(e.alice, id, "running").want(200)

		type result struct {
			r    resp
			done time.Time
		}
		got := make(chan result, 1)
		go func() {
			r := e.do("", "GET", api+"/tasks/"+id, nil, "Authorization: Bearer "+e.alice, "Prefer: wait=10")
			got <- result{r, time.Now()}
		}()
		// Let the long-poll reach its wait; a premature completion would make
		// it return at once without a wait (and fail the header check below).
		time.Sleep(200 * time.Millisecond)
		select {
		case r := <-got:
			t.Fatalf("long-poll returned before completion: %d %s", r.r.Status, r.r.Body)
		default:
		}
		e.patch(e.alice, id, "completed").want(200)
		completed := time.Now()
		select {
		case r := <-got:
			r.r.want(200)
			if r.r.M()["status"] != "completed" {
				t.Fatalf("long-poll saw %v", r.r.M()["status"])
			}
			if h := r.r.Header.Get("Preference-Applied"); h != "wait=10" {
				t.Fatalf("Preference-Applied %q, want wait=10", h)
			}
			if lag := r.done.Sub(completed); lag > 100*time.Millisecond {
				t.Fatalf("long-poll returned %s after completion, want < 100ms", lag)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("long-poll did not return after completion")
		}
	})
}
