package server_test

import (
	"net/http"
	"sync"
	"testing"
)

// Two fleets of one user, serving different jobs, claim at once. On
// PostgreSQL claims that meet go out as one group statement, which serves
// only the workers alike to its first one: every claim is still answered
// with a task of the claimer's own job while one is pending (no null answer
// before the queues are drained), and every task is claimed exactly once.
func TestClaimGroupServesEveryWorker(t *testing.T) {
	t.Parallel()
	eachWith(t, claimRaceOpts(), func(t *testing.T, e *env) {
		const (
			fleet  = 6
			perJob = 90
		)
		jobs := []string{"A", "B"}
		workerJob := map[string]string{}
		var workers []string
		for _, j := range jobs {
			for range fleet {
				w := e.registerJob(e.alice, "group", "modifiers", "Job"+j, nil)["worker_id"].(string)
				workers = append(workers, w)
				workerJob[w] = j
			}
		}
		jobOf := map[string]string{}
		for _, j := range jobs {
			payloads := make([]map[string]any, perJob)
			for i := range payloads {
				payloads[i] = map[string]any{"i": i}
			}
			for _, id := range e.submitBatch(e.bob, "group", "group:modifiers:Job"+j, payloads) {
				jobOf[id] = j
			}
		}
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: len(workers)}}
		var (
			mu    sync.Mutex
			seen  = map[string]string{}
			nulls int
			wg    sync.WaitGroup
			start = make(chan struct{})
		)
		for _, w := range workers {
			wg.Go(func() {
				<-start
				for range perJob / fleet {
					id, err := claimOnce(client, e.url, e.alice, w)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					if id == "" {
						nulls++
					} else if prev, dup := seen[id]; dup {
						t.Errorf("task %s claimed by %s and by %s", id, prev, w)
					} else {
						seen[id] = w
						if jobOf[id] != workerJob[w] {
							t.Errorf("worker of job %s handed task %s of job %s", workerJob[w], id, jobOf[id])
						}
					}
					mu.Unlock()
				}
			})
		}
		close(start)
		wg.Wait()
		if nulls != 0 || len(seen) != len(jobs)*perJob {
			t.Fatalf("%d tasks claimed with %d null answers, want %d and none", len(seen), nulls, len(jobs)*perJob)
		}
		page := e.do(e.admin, "GET", api+"/rooms/group/tasks?status=pending&limit=0", nil).want(200).M()
		if page["total"].(float64) != 0 {
			t.Fatalf("%v tasks still pending", page["total"])
		}
	})
}
