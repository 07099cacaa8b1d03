package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// withInternal registers internal jobs (built from the service) and ensures
// their rows before the service starts, as serve does.
func withInternal(jobs ...func(*joblib.Service) joblib.InternalJob) func(*setupOpts) {
	return func(o *setupOpts) {
		o.beforeStart = func(s *joblib.Service) {
			for _, j := range jobs {
				if err := s.RegisterInternal(j(s)); err != nil {
					panic(err)
				}
			}
			if err := s.EnsureInternalJobs(context.Background()); err != nil {
				panic(err)
			}
		}
	}
}

func internalJob(name string, h func(ctx context.Context, t joblib.InternalTask) (json.RawMessage, error)) func(*joblib.Service) joblib.InternalJob {
	return func(*joblib.Service) joblib.InternalJob {
		return joblib.InternalJob{Category: "modifiers", Name: name, Handler: h}
	}
}

// statuses are the task_status_event statuses recorded for one task, in order.
func (e *env) statuses(taskID string) []string {
	var out []string
	e.rec.mu.Lock()
	defer e.rec.mu.Unlock()
	for _, em := range e.rec.ems {
		if ev, ok := em.Event.(events.TaskStatusEvent); ok && ev.ID == taskID {
			out = append(out, ev.Status)
		}
	}
	return out
}

// awaitTask long-polls a task until it is terminal.
func (e *env) awaitTask(taskID string) map[string]any {
	e.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		m := e.do(e.alice, "GET", api+"/tasks/"+taskID, nil, "Prefer: wait=10").want(200).M()
		if s := m["status"]; s == "completed" || s == "failed" || s == "cancelled" {
			return m
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("task %s not terminal: %v", taskID, m)
		}
	}
}

func TestInternalRoomSummary(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		e := setup(t, db, withInternal(joblib.RoomSummaryJob))
		full := "@internal:analysis:RoomSummary"
		// the job is listed in every regular room, with its schema
		jobs := e.do(e.alice, "GET", api+"/rooms/lab/jobs", nil).want(200).Items()
		if !slices.ContainsFunc(jobs, func(j map[string]any) bool { return j["full_name"] == full }) {
			t.Fatalf("%s not listed: %v", full, jobs)
		}
		job := e.do(e.alice, "GET", api+"/rooms/lab/jobs/"+full, nil).want(200).M()
		if job["schema"].(map[string]any)["title"] != "RoomSummary" {
			t.Fatalf("schema %v", job["schema"])
		}
		e.registerJob(e.admin, "@global", "modifiers", "Rotate")
		e.submit(e.alice, "lab", "@global:modifiers:Rotate", nil)
		e.submit(e.alice, "lab", "@global:modifiers:Rotate", nil)
		e.provider(e.alice, "lab", "filesystem", "local")
		e.rec.take()

		r := e.do(e.alice, "POST", api+"/rooms/lab/tasks/"+full, map[string]any{"payload": map[string]any{}}).want(202)
		sub := r.M()
		if sub["status"] != "claimed" || sub["worker_id"] != nil || r.Header.Get("Location") != api+"/tasks/"+sub["id"].(string) {
			t.Fatalf("submission: %v, Location %q", sub, r.Header.Get("Location"))
		}
		id := sub["id"].(string)
		done := e.awaitTask(id)
		if done["status"] != "completed" || done["started_at"] == nil || done["completed_at"] == nil || done["error"] != nil {
			t.Fatalf("task %v", done)
		}
		var sum joblib.RoomSummary
		raw, _ := json.Marshal(done["result"])
		if err := json.Unmarshal(raw, &sum); err != nil {
			t.Fatalf("result %s: %v", raw, err)
		}
		want := map[string]int64{"pending": 2, "claimed": 0, "running": 1, "completed": 0, "failed": 0, "cancelled": 0, "total": 3}
		for k, v := range want {
			if sum.Tasks[k] != v {
				t.Fatalf("tasks[%s] = %d, want %d (%s)", k, sum.Tasks[k], v, raw)
			}
		}
		// jobs: @global Rotate + @internal RoomSummary; the provider; Rotate's worker
		if sum.RoomID != "lab" || sum.Jobs != 2 || sum.Providers != 1 || sum.Workers != 1 || sum.At.IsZero() {
			t.Fatalf("summary %s", raw)
		}
		waitFor(t, 5*time.Second, func() bool { return len(e.statuses(id)) == 3 })
		if got := e.statuses(id); !slices.Equal(got, []string{"claimed", "running", "completed"}) {
			t.Fatalf("task_status_event statuses %v", got)
		}
		for _, em := range e.rec.take() {
			if ta, ok := em.Event.(events.TaskAvailable); ok && ta.TaskID == id {
				t.Fatal("an internal task was announced to workers")
			}
			if ev, ok := em.Event.(events.TaskStatusEvent); ok && ev.ID == id && em.Room != "room:lab" {
				t.Fatalf("internal task event went to %s", em.Room)
			}
		}
		// external tasks show a null result
		if m := e.do(e.alice, "GET", api+"/rooms/lab/tasks?status=pending", nil).want(200).Items(); m[0]["result"] != nil {
			t.Fatalf("external task result %v", m[0]["result"])
		}
	})
}

func TestInternalTimeout(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		release := make(chan struct{})
		t.Cleanup(func() { close(release) })
		e := setup(t, db,
			withSettings(func(s *joblib.Settings) { s.InternalTaskTimeout = 300 * time.Millisecond }),
			withInternal(
				internalJob("Hang", func(ctx context.Context, _ joblib.InternalTask) (json.RawMessage, error) {
					<-ctx.Done()
					return nil, ctx.Err()
				}),
				// ignores its context: the task still fails on time
				internalJob("Stubborn", func(context.Context, joblib.InternalTask) (json.RawMessage, error) {
					<-release
					return json.RawMessage(`"too late"`), nil
				}),
			))
		for _, name := range []string{"Hang", "Stubborn"} {
			start := time.Now()
			id := e.submit(e.alice, "lab", "@internal:modifiers:"+name, nil)
			done := e.awaitTask(id)
			if done["status"] != "failed" || done["error"] != "Internal worker timeout" || done["started_at"] == nil {
				t.Fatalf("%s: %v", name, done)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("%s failed after %s, want about 300ms", name, d)
			}
			waitFor(t, 5*time.Second, func() bool { return len(e.statuses(id)) == 3 })
			if got := e.statuses(id); !slices.Equal(got, []string{"claimed", "running", "failed"}) {
				t.Fatalf("%s statuses %v", name, got)
			}
		}
	})
}

func TestInternalHandlerErrors(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		e := setup(t, db, withInternal(
			internalJob("Fails", func(context.Context, joblib.InternalTask) (json.RawMessage, error) {
				return nil, errors.New("no atoms selected")
			}),
			internalJob("Panics", func(context.Context, joblib.InternalTask) (json.RawMessage, error) { panic("boom") }),
			internalJob("BadJSON", func(context.Context, joblib.InternalTask) (json.RawMessage, error) {
				return json.RawMessage(`{nope`), nil
			}),
			internalJob("Echo", func(_ context.Context, t joblib.InternalTask) (json.RawMessage, error) {
				return json.Marshal(map[string]any{"room": t.RoomID, "payload": t.Payload})
			}),
		))
		for name, want := range map[string]string{"Fails": "no atoms selected", "Panics": "internal error: boom", "BadJSON": "internal job returned invalid JSON"} {
			done := e.awaitTask(e.submit(e.alice, "lab", "@internal:modifiers:"+name, nil))
			if done["status"] != "failed" || done["error"] != want {
				t.Fatalf("%s: %v", name, done)
			}
		}
		done := e.awaitTask(e.submit(e.alice, "lab", "@internal:modifiers:Echo", map[string]any{"n": 3}))
		got, _ := json.Marshal(done["result"])
		if done["status"] != "completed" || string(got) != `{"payload":{"n":3},"room":"lab"}` {
			t.Fatalf("echo: %v", done)
		}
	})
}

// A full executor does not block the request: the submission is stored
// failed with the contract's dispatch error, answered 202 without Location,
// and announces nothing. A task cancelled while queued never runs.
func TestInternalQueueFull(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		release := make(chan struct{})
		ran := make(chan string, 10)
		e := setup(t, db,
			withSettings(func(s *joblib.Settings) { s.InternalWorkers, s.InternalQueue = 1, 1 }),
			withInternal(internalJob("Block", func(ctx context.Context, t joblib.InternalTask) (json.RawMessage, error) {
				ran <- t.ID.String()
				select {
				case <-release:
					return nil, nil
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			})))
		first := e.submit(e.alice, "lab", "@internal:modifiers:Block", nil)
		if got := <-ran; got != first {
			t.Fatalf("ran %s", got)
		}
		queued := e.submit(e.alice, "lab", "@internal:modifiers:Block", nil)
		e.rec.take()
		start := time.Now()
		r := e.do(e.alice, "POST", api+"/rooms/lab/tasks/@internal:modifiers:Block", map[string]any{"payload": map[string]any{}}).want(202)
		if time.Since(start) > 2*time.Second {
			t.Fatal("a full executor blocked the request")
		}
		over := r.M()
		if over["status"] != "failed" || over["error"] != "Failed to dispatch to internal executor" || over["completed_at"] == nil {
			t.Fatalf("overflow task %v", over)
		}
		if r.Header.Get("Location") != "" || r.Header.Get("Retry-After") != "" {
			t.Fatal("a dispatch failure must not answer Location/Retry-After")
		}
		if evs := e.rec.take(); len(evs) != 0 {
			t.Fatalf("a dispatch failure emitted %v", evs)
		}
		e.patch(e.admin, queued, "cancelled").want(200)
		close(release)
		if done := e.awaitTask(first); done["status"] != "completed" {
			t.Fatalf("first task %v", done)
		}
		// The executor is free again once it has taken the cancelled task
		// off its queue and skipped it. The task's completion is stored
		// before the executor dequeues, so a submission right after it may
		// still meet the full queue (and be failed at once): submit until
		// one is dispatched, within a bound.
		var next string
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			m := e.do(e.alice, "POST", api+"/rooms/lab/tasks/@internal:modifiers:Block", map[string]any{"payload": map[string]any{}}).want(202).M()
			if m["status"] != "failed" {
				next = m["id"].(string)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the executor never took a task again: %v", m)
			}
		}
		select {
		case got := <-ran:
			if got != next {
				t.Fatalf("ran %s, want %s (the cancelled task must not run)", got, next)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the dispatched task never ran")
		}
		e.awaitTask(next)
		if m := e.do(e.alice, "GET", api+"/tasks/"+queued, nil).want(200).M(); m["status"] != "cancelled" || m["started_at"] != nil {
			t.Fatalf("cancelled queued task %v", m)
		}
	})
}

// Stopping the server fails what it was running and what was queued, so no
// internal task is left claimed without an executor.
func TestInternalStopFailsQueuedAndRunning(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		ran := make(chan struct{}, 10)
		e := setup(t, db,
			withSettings(func(s *joblib.Settings) { s.InternalWorkers, s.InternalQueue = 1, 5 }),
			withInternal(internalJob("Block", func(ctx context.Context, _ joblib.InternalTask) (json.RawMessage, error) {
				ran <- struct{}{}
				<-ctx.Done()
				return nil, ctx.Err()
			})))
		ids := []string{e.submit(e.alice, "lab", "@internal:modifiers:Block", nil)}
		<-ran
		ids = append(ids, e.submit(e.alice, "lab", "@internal:modifiers:Block", nil), e.submit(e.alice, "lab", "@internal:modifiers:Block", nil))
		e.svc.Stop()
		for _, id := range ids {
			m := e.do(e.alice, "GET", api+"/tasks/"+id, nil).want(200).M()
			if m["status"] != "failed" || m["error"] != "Internal executor stopped" {
				t.Fatalf("task %s after stop: %v", id, m)
			}
		}
		r := e.do(e.alice, "POST", api+"/rooms/lab/tasks/@internal:modifiers:Block", map[string]any{"payload": map[string]any{}}).want(202).M()
		if r["status"] != "failed" || r["error"] != "Failed to dispatch to internal executor" {
			t.Fatalf("submission to a stopped executor: %v", r)
		}
	})
}

// An @internal job row without an executor answers 503 and stores nothing.
func TestInternalWithoutExecutor(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		e.registerJob(e.admin, "@internal", "modifiers", "Rotate")
		m := e.do(e.alice, "POST", api+"/rooms/lab/tasks/@internal:modifiers:Rotate", map[string]any{"payload": map[string]any{}}).
			problem(503, "internal-job-not-configured")
		if m["detail"] != "Internal job '@internal:modifiers:Rotate' is registered but no executor is available" || m["title"] != "Service Unavailable" {
			t.Fatalf("problem %v", m)
		}
		var p struct{ Total int }
		e.do(e.alice, "GET", api+"/rooms/lab/tasks", nil).want(200).JSON(&p)
		if p.Total != 0 {
			t.Fatal("a 503 submission stored a task")
		}
		// registering @internal jobs over REST takes a superuser
		e.do(e.alice, "PUT", api+"/rooms/@internal/jobs", map[string]any{"category": "modifiers", "name": "X"}).problem(403, "forbidden")
	})
}

// test_registry.py: registration makes job rows, reactivates deleted ones and
// overwrites schemas; it is idempotent.
func TestInternalRegistry(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		e := setup(t, db)
		ctx := t.Context()
		noop := func(context.Context, joblib.InternalTask) (json.RawMessage, error) { return nil, nil }
		if err := e.svc.EnsureInternalJobs(ctx); err != nil {
			t.Fatal(err)
		}
		var p struct{ Total int }
		e.do(e.alice, "GET", api+"/rooms/@internal/jobs", nil).want(200).JSON(&p)
		if p.Total != 0 {
			t.Fatal("no registrations made job rows")
		}
		for _, bad := range []joblib.InternalJob{
			{Category: "modifiers", Handler: noop},
			{Name: "X", Handler: noop},
			{Category: "modifiers", Name: "X"},
			{Category: "modifiers", Name: "X", Handler: noop, Schema: json.RawMessage(`[1]`)},
		} {
			if err := e.svc.RegisterInternal(bad); err == nil {
				t.Fatalf("RegisterInternal(%+v) accepted", bad)
			}
		}
		for _, name := range []string{"Rotate", "Scale"} {
			if err := e.svc.RegisterInternal(joblib.InternalJob{Category: "modifiers", Name: name, Handler: noop,
				Schema: json.RawMessage(`{"properties":{"angle":{"type":"number"}}}`)}); err != nil {
				t.Fatal(err)
			}
		}
		var names []string
		for _, j := range e.svc.InternalJobs() {
			names = append(names, j.FullName())
		}
		slices.Sort(names)
		if !slices.Equal(names, []string{"@internal:modifiers:Rotate", "@internal:modifiers:Scale"}) {
			t.Fatalf("registry %v", names)
		}
		for range 2 {
			if err := e.svc.EnsureInternalJobs(ctx); err != nil {
				t.Fatal(err)
			}
		}
		e.do(e.alice, "GET", api+"/rooms/@internal/jobs", nil).want(200).JSON(&p)
		if p.Total != 2 {
			t.Fatalf("%d internal jobs, want 2", p.Total)
		}
		job := e.do(e.alice, "GET", api+"/rooms/lab/jobs/@internal:modifiers:Rotate", nil).want(200).M()

		// a deleted row is reactivated, and the schema follows the code
		q := db.Q(ctx)
		j, err := q.JobByKey("@internal", "modifiers", "Rotate")
		if err != nil {
			t.Fatal(err)
		}
		if err := q.SetJobDeleted(j.ID, true); err != nil {
			t.Fatal(err)
		}
		e.do(e.alice, "GET", api+"/rooms/lab/jobs/@internal:modifiers:Rotate", nil).problem(404, "job-not-found")
		if err := e.svc.RegisterInternal(joblib.InternalJob{Category: "modifiers", Name: "Rotate", Handler: noop,
			Schema: json.RawMessage(`{"properties":{"degrees":{"type":"number"}}}`)}); err != nil {
			t.Fatal(err)
		}
		if err := e.svc.EnsureInternalJobs(ctx); err != nil {
			t.Fatal(err)
		}
		again := e.do(e.alice, "GET", api+"/rooms/lab/jobs/@internal:modifiers:Rotate", nil).want(200).M()
		if again["id"] != job["id"] {
			t.Fatal("reactivation made a new row")
		}
		if _, ok := again["schema"].(map[string]any)["properties"].(map[string]any)["degrees"]; !ok {
			t.Fatalf("schema not overwritten: %v", again["schema"])
		}
	})
}
