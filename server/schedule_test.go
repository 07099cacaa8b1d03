package server_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// promote makes the due delayed tasks claimable, as the sweeper's leader
// does at their run_at.
func (e *env) promote() []joblib.Task {
	e.t.Helper()
	ts, err := e.svc.PromoteDueTasks(context.Background(), joblib.LeaderFence{})
	if err != nil {
		e.t.Fatal(err)
	}
	return ts
}

// dueNow moves a delayed task's run_at to the database's now, as if its
// time had come (the test does not wait it out).
func (e *env) dueNow(id string) {
	e.t.Helper()
	if err := e.db.Q(context.Background()).SetTaskRunAtAge(uuid.MustParse(id), 0); err != nil {
		e.t.Fatal(err)
	}
}

// runAtAhead is how far the task's run_at is ahead of the database's now.
func (e *env) runAtAhead(id string) time.Duration {
	e.t.Helper()
	q := e.db.Q(context.Background())
	tk, err := q.GetTask(uuid.MustParse(id))
	if err != nil {
		e.t.Fatal(err)
	}
	now, err := q.DBNow()
	if err != nil {
		e.t.Fatal(err)
	}
	if !tk.RunAt.Valid() {
		e.t.Fatalf("task %s has no run_at", id)
	}
	return tk.RunAt.Sub(now.Time)
}

// fail reports a task failed with an error (and "retry" when given).
func (e *env) fail(token, id, msg string, retry ...bool) map[string]any {
	e.t.Helper()
	body := map[string]any{"status": "failed", "error": msg}
	if len(retry) > 0 {
		body["retry"] = retry[0]
	}
	return e.do(token, "PATCH", api+"/tasks/"+id, body).want(200).M()
}

// A job with a retry policy: a failed report puts the task back to pending,
// not claimable before its backoff (backoff × 2^(attempt-1), at most
// max_backoff, plus at most 10 % jitter) has passed on the database clock;
// the task shows attempt, run_at and each attempt's error; the last attempt's
// failure is final; "retry": false is final at once.
func TestRetryBackoff(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		reg := e.registerJob(e.alice, "room", "modifiers", "Flaky", map[string]any{"retry": map[string]any{"max_attempts": 3, "backoff": 2, "max_backoff": 3}})
		if r, _ := reg["retry"].(map[string]any); r["max_attempts"] != 3.0 || r["backoff"] != 2.0 || r["max_backoff"] != 3.0 || reg["max_attempts"] != 3.0 {
			t.Fatalf("job %v", reg)
		}
		wid := reg["worker_id"].(string)
		id := e.submit(e.bob, "room", "room:modifiers:Flaky", nil)
		for attempt, want := range []time.Duration{2 * time.Second, 3 * time.Second} { // 2 × 2^0, min(3, 2 × 2^1)
			if c := e.claim(e.alice, wid); c["id"] != id || c["attempt"] != float64(attempt+1) {
				t.Fatalf("claim %d: %v", attempt+1, c)
			}
			got := e.fail(e.alice, id, fmt.Sprintf("busy %d", attempt+1))
			if got["status"] != "pending" || got["run_at"] == nil || got["worker_id"] != nil || got["queue_position"] != nil || got["error"] != fmt.Sprintf("busy %d", attempt+1) {
				t.Fatalf("after failure %d: %v", attempt+1, got)
			}
			if errs, _ := got["errors"].([]any); len(errs) != attempt+1 || errs[attempt].(map[string]any)["attempt"] != float64(attempt+1) ||
				errs[attempt].(map[string]any)["error"] != fmt.Sprintf("busy %d", attempt+1) || errs[attempt].(map[string]any)["at"] == nil {
				t.Fatalf("errors after failure %d: %v", attempt+1, got["errors"])
			}
			// On the database clock: run_at is the backoff (and its jitter)
			// ahead of the failure, less the time this read took.
			if ahead := e.runAtAhead(id); ahead > want+want/10+50*time.Millisecond || ahead < want-500*time.Millisecond {
				t.Fatalf("attempt %d: run_at %s ahead, want %s (+10%%)", attempt+1, ahead, want)
			}
			// Not claimable before, nor made claimable by the leader.
			if c := e.claim(e.alice, wid); c != nil {
				t.Fatalf("claimed during its backoff: %v", c)
			}
			if p := e.promote(); len(p) != 0 {
				t.Fatalf("promoted before its run_at: %v", p)
			}
			e.dueNow(id)
			if p := e.promote(); len(p) != 1 || p[0].ID.String() != id || p[0].QueuePosition == nil || *p[0].QueuePosition != 1 {
				t.Fatalf("promoted %+v", p)
			}
		}
		c := e.claim(e.alice, wid)
		if c["id"] != id || c["attempt"] != 3.0 {
			t.Fatalf("third claim %v", c)
		}
		// The attempts are spent: final.
		got := e.fail(e.alice, id, "busy 3")
		if got["status"] != "failed" || got["error"] != "busy 3" || len(got["errors"].([]any)) != 3 {
			t.Fatalf("last failure %v", got)
		}
		// "retry": false: final at once, its error kept.
		id2 := e.submit(e.bob, "room", "room:modifiers:Flaky", nil)
		if c := e.claim(e.alice, wid); c["id"] != id2 {
			t.Fatalf("claim %v", c)
		}
		if got := e.fail(e.alice, id2, "bad input", false); got["status"] != "failed" || got["attempt"] != 1.0 || len(got["errors"].([]any)) != 1 {
			t.Fatalf("retry false: %v", got)
		}
		// The batch update path retries the same way.
		id3 := e.submit(e.bob, "room", "room:modifiers:Flaky", nil)
		e.claim(e.alice, wid)
		r := e.do(e.alice, "POST", api+"/tasks/update-batch", map[string]any{"updates": []any{map[string]any{"task_id": id3, "status": "failed", "error": "x"}}}).want(200).M()
		if tk := r["results"].([]any)[0].(map[string]any)["task"].(map[string]any); tk["status"] != "pending" || tk["run_at"] == nil {
			t.Fatalf("batch failure: %v", r)
		}
		// A job without retry: a failure is final (today's behaviour).
		plain := e.registerJob(e.alice, "room", "modifiers", "Plain")["worker_id"].(string)
		id4 := e.submit(e.bob, "room", "room:modifiers:Plain", nil)
		e.claim(e.alice, plain)
		if got := e.fail(e.alice, id4, "x"); got["status"] != "failed" || got["errors"] != nil || got["run_at"] != nil || got["priority"] != 0.0 {
			t.Fatalf("plain failure: %v", got)
		}
		// Bad policies are 422.
		for _, bad := range []map[string]any{
			{"max_attempts": 0, "backoff": -1}, {"max_attempts": 1001, "backoff": 1}, {"max_attempts": 2, "backoff": 10, "max_backoff": 5},
		} {
			e.do(e.alice, "PUT", api+"/rooms/room/jobs", map[string]any{"category": "modifiers", "name": "Bad", "schema": map[string]any{}, "retry": bad}).problem(422, "validation-error")
		}
		e.do(e.alice, "PUT", api+"/rooms/room/jobs", map[string]any{"category": "modifiers", "name": "Bad", "schema": map[string]any{}, "max_attempts": 2, "retry": map[string]any{"max_attempts": 3}}).problem(422, "validation-error")
	})
}

// Worker loss counts against the retry's max_attempts: a task requeued on
// its worker's loss and then failed by a report on its last attempt is
// final.
func TestRetryCountsWorkerLoss(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		policy := map[string]any{"on_worker_loss": "requeue", "retry": map[string]any{"max_attempts": 2, "backoff": 0.1}}
		first := e.registerJob(e.alice, "room", "modifiers", "Lossy", policy)["worker_id"].(string)
		id := e.submit(e.bob, "room", "room:modifiers:Lossy", nil)
		e.claim(e.alice, first)
		e.do(e.alice, "DELETE", api+"/workers/"+first, nil).want(204)
		if got := e.getTask(id); got["status"] != "pending" || got["attempt"] != 1.0 {
			t.Fatalf("after the loss %v", got)
		}
		second := e.registerJob(e.alice, "room", "modifiers", "Lossy", policy)["worker_id"].(string)
		if c := e.claim(e.alice, second); c["id"] != id || c["attempt"] != 2.0 {
			t.Fatalf("claim after loss %v", c)
		}
		if got := e.fail(e.alice, id, "again"); got["status"] != "failed" {
			t.Fatalf("failure on the last attempt: %v", got)
		}
	})
}

// Priorities and delays: a claim takes the highest priority first, FIFO
// by submission within one priority, never a delayed task before its time;
// a task with a run_at in the past is claimable at once; queue positions
// count claim order and leave delayed tasks out; validation.
func TestPriorityAndDelay(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		wid := e.registerJob(e.alice, "room", "modifiers", "Prio")["worker_id"].(string)
		job := "room:modifiers:Prio"
		path := api + "/rooms/room/tasks/" + job
		past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
		tomorrow := time.Now().Add(24 * time.Hour).UTC().Format(time.RFC3339Nano)
		var ans struct {
			Tasks []joblib.Task `json:"tasks"`
		}
		e.do(e.bob, "POST", path+"/batch", `{"tasks": [
			{"payload": {"n": 0}},
			{"payload": {"n": 1}, "priority": 5},
			{"payload": {"n": 2}, "priority": 5, "delay": 3600},
			{"payload": {"n": 3}, "priority": -3},
			{"payload": {"n": 4}, "priority": 100, "run_at": "`+tomorrow+`"},
			{"payload": {"n": 5}, "priority": 5, "run_at": "`+past+`"},
			{"payload": {"n": 6}, "timeout": 30}
		]}`).want(202).JSON(&ans)
		single := e.do(e.bob, "POST", path, map[string]any{"payload": map[string]any{"n": 7}, "priority": 7}).want(202).M()
		delayed := e.do(e.bob, "POST", path, map[string]any{"payload": map[string]any{"n": 8}, "delay": 0.0}).want(202).M()
		if single["priority"] != 7.0 || single["queue_position"] != 1.0 || delayed["queue_position"] == nil {
			t.Fatalf("single %v, delay 0 %v", single, delayed)
		}
		want := map[int]int64{1: 2, 5: 3, 0: 4, 6: 5, 3: 7} // claim order: 7 (priority 7), 1, 5, 0, 6, 8 (delay 0), 3
		for i, tk := range ans.Tasks {
			got := e.getTask(tk.ID.String())
			if p, ok := want[i]; ok {
				if got["queue_position"] != float64(p) {
					t.Errorf("task %d: queue_position %v, want %d", i, got["queue_position"], p)
				}
			} else if got["queue_position"] != nil || got["run_at"] == nil {
				t.Errorf("delayed task %d: %v", i, got)
			}
		}
		order := []string{single["id"].(string), ans.Tasks[1].ID.String(), ans.Tasks[5].ID.String(), ans.Tasks[0].ID.String(), ans.Tasks[6].ID.String(), delayed["id"].(string), ans.Tasks[3].ID.String()}
		for i, id := range order {
			c := e.claim(e.alice, wid)
			if c == nil || c["id"] != id {
				t.Fatalf("claim %d: %v, want %s", i, c, id)
			}
		}
		if c := e.claim(e.alice, wid); c != nil {
			t.Fatalf("a delayed task was claimed early: %v", c)
		}
		for _, bad := range []string{
			`{"payload": {}, "priority": 101}`, `{"payload": {}, "priority": -101}`, `{"payload": {}, "priority": 1.5}`,
			`{"payload": {}, "priority": "high"}`, `{"payload": {}, "run_at": "tomorrow"}`, `{"payload": {}, "delay": -1}`,
			`{"payload": {}, "delay": "1"}`, `{"payload": {}, "delay": 1, "run_at": "` + past + `"}`,
			`{"payload": {}, "run_at": "2999-01-01T00:00:00Z"}`, `{"payload": {}, "delay": 1e9}`,
		} {
			e.do(e.bob, "POST", path, bad).problem(422, "validation-error")
			e.do(e.bob, "POST", path+"/batch", `{"tasks": [{}, `+bad+`]}`).problem(422, "validation-error")
		}
	})
}

// 16 workers claim at once from a queue mixing priorities and delays:
// every claimable task is claimed exactly once, no delayed one is, and each
// claimer's tasks come in claim order (priority, then submission).
func TestPriorityDelayRacingClaimers(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		const claimers, n = 16, 240
		workers := e.workersOn(e.alice, "room", "Race", claimers)
		items := make([]map[string]any, n)
		for i := range items {
			items[i] = map[string]any{"payload": map[string]any{"i": i}, "priority": i%7 - 3}
			if i%5 == 0 {
				items[i]["delay"] = 3600
			}
		}
		var ans struct {
			Tasks []joblib.Task `json:"tasks"`
		}
		e.do(e.bob, "POST", api+"/rooms/room/tasks/room:modifiers:Race/batch", map[string]any{"tasks": items}).want(202).JSON(&ans)
		rank := map[string]int{} // claim order of the claimable tasks
		type key struct{ prio, i int }
		var keys []key
		for i := range items {
			if i%5 != 0 {
				keys = append(keys, key{-(i%7 - 3), i})
			}
		}
		slices.SortFunc(keys, func(a, b key) int {
			if a.prio != b.prio {
				return a.prio - b.prio
			}
			return a.i - b.i
		})
		for r, k := range keys {
			rank[ans.Tasks[k.i].ID.String()] = r
		}
		var mu sync.Mutex
		got := map[string]int{}
		errs := make(chan error, claimers)
		var wg sync.WaitGroup
		for _, w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				last := -1
				for {
					id, err := e.tryClaim(e.alice, w)
					if err != nil {
						errs <- err
						return
					}
					if id == "" {
						return
					}
					r, ok := rank[id]
					if !ok {
						errs <- fmt.Errorf("claimed %s, delayed or unknown", id)
						return
					}
					if r < last {
						errs <- fmt.Errorf("worker %s claimed rank %d after rank %d", w, r, last)
						return
					}
					last = r
					mu.Lock()
					got[id]++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if len(got) != len(rank) {
			t.Fatalf("%d tasks claimed, want %d", len(got), len(rank))
		}
		for id, c := range got {
			if c != 1 {
				t.Fatalf("task %s claimed %d times", id, c)
			}
		}
	})
}

// A delayed task wakes a worker's socket with task_available when it
// becomes due: the sweeper's leader arms one timer at its run_at; the
// worker does not poll.
func TestDelayedTaskWakesSocketWorker(t *testing.T) {
	t.Parallel()
	eachRealtime(t, func(t *testing.T, e *env) {
		job := e.registerJob(e.alice, "r1", "modifiers", "Later")
		worker := mustDialSIO(t, e.url, e.alice)
		worker.mustCall("join_job_room", map[string]any{"job_name": "r1:modifiers:Later", "worker_id": job["worker_id"]})
		leadWithTimerOnly(t, e) // the timer, not the probe, must wake it
		const delay = 700 * time.Millisecond
		sent := time.Now()
		r := e.do(e.bob, "POST", api+"/rooms/r1/tasks/r1:modifiers:Later", map[string]any{"payload": map[string]any{}, "delay": delay.Seconds()}).want(202).M()
		id := r["id"].(string)
		if got := worker.eventsNamed("task_available"); len(got) != 0 {
			t.Fatalf("task_available before the task is due: %v", got)
		}
		ev := worker.waitEvent("task_available", 10*time.Second, func(p map[string]any) bool { return p["task_id"] == id })
		if since := time.Since(sent); since < delay-50*time.Millisecond {
			t.Fatalf("task_available %s after the submission, before its delay %s", since, delay)
		}
		if ev.Payload["job_name"] != "r1:modifiers:Later" {
			t.Fatalf("payload %v", ev.Payload)
		}
		if c := e.claim(e.alice, job["worker_id"].(string)); c == nil || c["id"] != id {
			t.Fatalf("claim after the wake-up: %v", c)
		}
	})
}

// A delayed task submitted to a node that does not lead the sweeper wakes
// its job's workers on time too: the submission kicks the leader's timer on
// the other node through the bus (the leader's probe is a minute away), and
// task_available reaches a worker whose socket is on the submitting node.
func TestDelayedTaskOnAnotherNodeWakesWorker(t *testing.T) {
	t.Parallel()
	a, b := twoNodes(t)
	job := a.registerJob(a.alice, "r2", "modifiers", "Later")
	worker := mustDialSIO(t, b.url, b.alice)
	worker.mustCall("join_job_room", map[string]any{"job_name": "r2:modifiers:Later", "worker_id": job["worker_id"]})
	leadWithTimerOnly(t, a)
	// Let the leader's first look (nothing delayed yet) pass, so that only
	// a kick can arm its timer for the task below.
	time.Sleep(200 * time.Millisecond)
	const delay = 700 * time.Millisecond
	sent := time.Now()
	id := b.do(b.bob, "POST", api+"/rooms/r2/tasks/r2:modifiers:Later", map[string]any{"payload": map[string]any{}, "delay": delay.Seconds()}).want(202).M()["id"].(string)
	worker.waitEvent("task_available", 10*time.Second, func(p map[string]any) bool { return p["task_id"] == id })
	if since := time.Since(sent); since < delay-50*time.Millisecond {
		t.Fatalf("task_available %s after the submission, before its delay %s", since, delay)
	}
	if c := b.claim(b.alice, job["worker_id"].(string)); c == nil || c["id"] != id {
		t.Fatalf("claim after the wake-up: %v", c)
	}
}

// leadWithTimerOnly starts a sweeper on e whose probes are a minute apart,
// so that only its timer and its kicks can wake a delayed task, and waits
// until it leads.
func leadWithTimerOnly(tb testing.TB, e *env) {
	tb.Helper()
	sw := joblib.NewSweeper(e.svc, joblib.SweeperConfig{Jitter: -1, Probe: time.Minute})
	if err := sw.Start(context.Background()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(sw.Stop)
	waitFor(tb, 10*time.Second, sw.Leading)
}

// BenchmarkDelayedTaskWakeup measures a delayed task's wake-up: from its
// run_at (as the submission's answer states it, database clock) to the
// task_available frame at a worker's socket. It reports the median and the
// largest latency of b.N tasks, each delayed by 200 ms, submitted one at a
// time to the leader's node.
//
//	go test -run '^$' -bench DelayedTaskWakeup -benchtime 20x ./server
func BenchmarkDelayedTaskWakeup(b *testing.B) {
	for _, d := range []models.Dialect{models.SQLite, models.Postgres} {
		b.Run(string(d), func(b *testing.B) {
			e := setup(b, dbtest.Open(b, d), withRealtime(realtimeCfg()))
			job := e.registerJob(e.alice, "r1", "modifiers", "Later")
			worker := mustDialSIO(b, e.url, e.alice)
			worker.mustCall("join_job_room", map[string]any{"job_name": "r1:modifiers:Later", "worker_id": job["worker_id"]})
			leadWithTimerOnly(b, e)
			var lat []time.Duration
			for range b.N {
				r := e.do(e.bob, "POST", api+"/rooms/r1/tasks/r1:modifiers:Later", map[string]any{"payload": map[string]any{}, "delay": 0.2}).want(202).M()
				runAt, err := time.Parse(time.RFC3339Nano, r["run_at"].(string))
				if err != nil {
					b.Fatal(err)
				}
				ev := worker.waitEvent("task_available", 10*time.Second, func(p map[string]any) bool { return p["task_id"] == r["id"] })
				lat = append(lat, ev.At.Sub(runAt))
				if c := e.claim(e.alice, job["worker_id"].(string)); c == nil {
					b.Fatal("the woken task was not claimable")
				}
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
		})
	}
}
