package joblib_test

import (
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/internal/taskstatus"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

func secs(n int) *int { return &n }

// timedJob registers job name in room "r" for a new worker of alice's with
// the given limits and policies, and returns the worker.
func (b *bundle) timedJob(name string, r joblib.RegisterJobParams) uuid.UUID {
	b.t.Helper()
	w, err := b.svc.CreateWorker(b.ctx, b.alice)
	b.must(err)
	r.Category, r.Name, r.WorkerID = "modifiers", name, &w.ID
	_, _, err = b.svc.RegisterJob(b.ctx, b.alice, "r", r)
	b.must(err)
	return w.ID
}

func (b *bundle) ageClaims(d time.Duration, ids ...uuid.UUID) {
	b.t.Helper()
	b.must(b.db.Q(b.ctx).SetTaskClaimAge(ids, d))
}

// cancelledEvents lists the task_cancelled emissions, by task id.
func cancelledEvents(ems []events.Emission) map[string][]events.Emission {
	out := map[string][]events.Emission{}
	for _, e := range ems {
		if ev, ok := e.Event.(events.TaskCancelled); ok {
			out[ev.TaskID] = append(out[ev.TaskID], e)
		}
	}
	return out
}

// A task past task_timeout (from its claim) or heartbeat_timeout (from its
// claim, without progress) by the database's clock is timed out by a sweep
// while its worker stays alive: failed with an error naming the limit, or
// requeued while max_attempts allows; one status event, task_cancelled to
// the holder's room, and an audit row with the evidence. Just under the
// limit nothing happens.
func TestSweepTimesOutStuckTasksByDatabaseClock(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b := setup(t, db)
		wa := b.timedJob("a", joblib.RegisterJobParams{TaskTimeout: secs(60)})
		wb := b.timedJob("b", joblib.RegisterJobParams{HeartbeatTimeout: secs(30), OnTimeout: joblib.OnTimeoutRequeue,
			OnWorkerLoss: joblib.OnWorkerLossRequeue, MaxAttempts: 2})
		a := b.submit(jobSpec{name: "a"})
		bt := b.submit(jobSpec{name: "b"})
		b.claim(wa)
		b.claim(wb)
		if tk := b.task(a); !tk.DeadlineAt.Valid() || *tk.TaskTimeout != 60 || tk.HeartbeatTimeout != nil {
			t.Fatalf("claimed task a: deadline %v limits %v/%v", tk.DeadlineAt, tk.TaskTimeout, tk.HeartbeatTimeout)
		}
		if tk := b.task(bt); tk.DeadlineAt.Sub(tk.ClaimedAt.Time) != 30*time.Second {
			t.Fatalf("task b: deadline %s after the claim, want 30s", tk.DeadlineAt.Sub(tk.ClaimedAt.Time))
		}
		b.ageClaims(59*time.Second, a)
		b.ageClaims(29*time.Second, bt)
		b.progress(b.alice, bt, joblib.Progress{Current: num(1)})
		b.rec.take()
		rep, err := b.svc.Sweep(b.ctx, joblib.SweepParams{})
		b.must(err)
		if len(rep.TimedOut) != 0 || len(b.rec.take()) != 0 {
			t.Fatalf("tasks under their limits timed out: %+v", rep.TimedOut)
		}

		b.ageClaims(61*time.Second, a)
		b.ageClaims(31*time.Second, bt)
		rep, err = b.svc.Sweep(b.ctx, joblib.SweepParams{})
		b.must(err)
		if len(rep.TimedOut) != 2 || rep.Result.Cleaned != 0 {
			t.Fatalf("sweep timed out %d tasks, cleaned %d workers", len(rep.TimedOut), rep.Result.Cleaned)
		}
		if !b.workerExists(wa) || !b.workerExists(wb) {
			t.Fatal("a worker was cleaned: only its task is stuck")
		}
		tk := b.task(a)
		if tk.Status != models.StatusFailed || tk.Error == nil || *tk.Error != "Task timed out: task_timeout of 60s passed since the claim" {
			t.Fatalf("task a: %s %v", tk.Status, tk.Error)
		}
		tk = b.task(bt)
		if tk.Status != models.StatusPending || tk.WorkerID != nil || tk.Attempt != 1 {
			t.Fatalf("task b not requeued: %s worker %v attempt %d", tk.Status, tk.WorkerID, tk.Attempt)
		}
		ems := b.rec.take()
		st, cn := statusEvents(ems), cancelledEvents(ems)
		if len(st[a.String()]) != 1 || len(st[bt.String()]) != 1 || len(st) != 2 {
			t.Fatalf("status events %+v", st)
		}
		if c := cn[a.String()]; len(c) != 1 || c[0].Room != events.WorkerRoom(wa.String()) ||
			c[0].Event.(events.TaskCancelled).Reason != "Task timed out: task_timeout of 60s passed since the claim" {
			t.Fatalf("task_cancelled for a: %+v", c)
		}
		if c := cn[bt.String()]; len(c) != 1 || c[0].Room != events.WorkerRoom(wb.String()) ||
			!strings.Contains(c[0].Event.(events.TaskCancelled).Reason, "heartbeat_timeout of 30s") {
			t.Fatalf("task_cancelled for b: %+v", c)
		}
		available := 0
		for _, e := range ems {
			if ev, ok := e.Event.(events.TaskAvailable); ok && ev.TaskID == bt.String() {
				available++
			}
		}
		if available != 1 {
			t.Fatalf("%d task_available for the requeued task, want 1", available)
		}
		audit, err := b.svc.ListAudit(b.ctx, joblib.AuditTaskTimeout, 10)
		b.must(err)
		if len(audit) != 2 {
			t.Fatalf("%d timeout audit rows, want 2", len(audit))
		}
		for _, e := range audit {
			var d struct {
				Limit      string    `json:"limit"`
				Seconds    int       `json:"seconds"`
				ClaimedAt  time.Time `json:"claimed_at"`
				DeadlineAt time.Time `json:"deadline_at"`
				DBNow      time.Time `json:"db_now"`
				WorkerID   uuid.UUID `json:"worker_id"`
				Outcome    string    `json:"outcome"`
			}
			b.must(json.Unmarshal(e.Detail, &d))
			want := map[uuid.UUID]string{a: "task_timeout 60 failed", bt: "heartbeat_timeout 30 requeued"}[*e.SubjectID]
			if got := d.Limit + " " + strconv.Itoa(d.Seconds) + " " + d.Outcome; got != want {
				t.Fatalf("audit %s: %q, want %q", e.SubjectID, got, want)
			}
			if late := d.DBNow.Sub(d.ClaimedAt); late < time.Duration(d.Seconds)*time.Second || late > time.Duration(d.Seconds)*time.Second+time.Minute {
				t.Fatalf("audit evidence: db_now - claimed_at = %s for a %ds limit", late, d.Seconds)
			}
		}

		// The requeued task's second attempt is its last: it fails.
		if got := b.claim(wb); got != bt {
			t.Fatalf("claimed %s, want the requeued %s", got, bt)
		}
		if tk := b.task(bt); tk.ProgressAt.Valid() || tk.ProgressCurrent != nil {
			t.Fatalf("a new attempt kept the last attempt's progress: %v", tk.ProgressCurrent)
		}
		b.ageClaims(31*time.Second, bt)
		_, err = b.svc.Sweep(b.ctx, joblib.SweepParams{})
		b.must(err)
		if tk := b.task(bt); tk.Status != models.StatusFailed || tk.Attempt != 2 ||
			*tk.Error != "Task timed out: heartbeat_timeout of 30s passed without progress" {
			t.Fatalf("exhausted task b: %s attempt %d %v", tk.Status, tk.Attempt, tk.Error)
		}

		// The hung worker's late report changes nothing.
		_, err = b.svc.UpdateTask(b.ctx, b.alice, a, models.StatusCompleted, nil)
		if !joblib.IsCode(err, joblib.CodeInvalidTaskTransition) {
			t.Fatalf("late report: %v, want invalid-task-transition", err)
		}
		if tk := b.task(a); tk.Status != models.StatusFailed {
			t.Fatalf("late report changed the task: %s", tk.Status)
		}
	})
}

// A report that arrives once the task is past its deadline, before any
// sweep, is refused by the statement that would apply it (409) and changes
// nothing, on the single and the batch path; the sweep then times the task
// out with one status event.
func TestReportPastDeadlineIsRefused(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b := setup(t, db)
		w := b.timedJob("a", joblib.RegisterJobParams{TaskTimeout: secs(60)})
		one, two := b.submit(jobSpec{name: "a"}), b.submit(jobSpec{name: "a"})
		ts, err := b.svc.ClaimTasks(b.ctx, b.alice, w, 2, true)
		b.must(err)
		if len(ts) != 2 || ts[0].DeadlineAt.IsZero() {
			t.Fatalf("claimed %+v", ts)
		}
		b.ageClaims(61*time.Second, one, two)
		b.rec.take()
		_, err = b.svc.UpdateTask(b.ctx, b.alice, one, models.StatusCompleted, nil)
		if !joblib.IsCode(err, joblib.CodeInvalidTaskTransition) || !strings.Contains(err.Error(), "past its deadline") {
			t.Fatalf("late report: %v", err)
		}
		rs, err := b.svc.UpdateTasks(b.ctx, b.alice, []joblib.TaskUpdate{{TaskID: two, Status: models.StatusCompleted}})
		b.must(err)
		if !joblib.IsCode(rs[0].Err, joblib.CodeInvalidTaskTransition) {
			t.Fatalf("late batch report: %v", rs[0].Err)
		}
		for _, id := range []uuid.UUID{one, two} {
			if tk := b.task(id); tk.Status != models.StatusRunning {
				t.Fatalf("late report applied: %s", tk.Status)
			}
		}
		if ems := b.rec.take(); len(ems) != 0 {
			t.Fatalf("refused reports published %d events", len(ems))
		}
		rep, err := b.svc.Sweep(b.ctx, joblib.SweepParams{})
		b.must(err)
		if len(rep.TimedOut) != 2 {
			t.Fatalf("timed out %d", len(rep.TimedOut))
		}
		if st := statusEvents(b.rec.take()); len(st[one.String()]) != 1 || len(st[two.String()]) != 1 {
			t.Fatalf("status events %+v", st)
		}
	})
}

// Two nodes sweeping the same stuck tasks at once time each out once: one
// status event, one task_cancelled and one audit row per task in total.
func TestStuckTaskTimedOutOnceAcrossNodes(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b := setup(t, db, func(s *joblib.Settings) { s.SweepBatchSize = 7 })
		other := setup(t, db, func(s *joblib.Settings) { s.SweepBatchSize = 7 })
		const n = 60
		w := b.timedJob("a", joblib.RegisterJobParams{TaskTimeout: secs(5)})
		ids := make([]uuid.UUID, n)
		for i := range ids {
			ids[i] = b.submit(jobSpec{name: "a"})
		}
		_, err := b.svc.ClaimTasks(b.ctx, b.alice, w, n, true)
		b.must(err)
		b.ageClaims(10*time.Second, ids...)
		b.rec.take()
		var wg sync.WaitGroup
		for _, s := range []*joblib.Service{b.svc, other.svc, b.svc, other.svc} {
			wg.Go(func() {
				if _, err := s.TimeOutTasks(b.ctx, nil, joblib.LeaderFence{}); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		ems := append(b.rec.take(), other.rec.take()...)
		st, cn := statusEvents(ems), cancelledEvents(ems)
		for _, id := range ids {
			if len(st[id.String()]) != 1 || len(cn[id.String()]) != 1 {
				t.Fatalf("task %s: %d status events, %d task_cancelled", id, len(st[id.String()]), len(cn[id.String()]))
			}
			if tk := b.task(id); tk.Status != models.StatusFailed {
				t.Fatalf("task %s %s", id, tk.Status)
			}
		}
		audit, err := b.svc.ListAudit(b.ctx, joblib.AuditTaskTimeout, 1000)
		b.must(err)
		if len(audit) != n {
			t.Fatalf("%d audit rows for %d tasks", len(audit), n)
		}
	})
}

// Completions race the timeout of their tasks (a 1 s submission timeout,
// reports spread around it, sweeps every few milliseconds): each task ends
// exactly once, completed exactly when its report was accepted and failed
// by the timeout exactly when it was refused, with one terminal event.
func TestCompletionRacingTimeoutExactlyOnce(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b := setup(t, db)
		const n = 30
		w := b.timedJob("a", joblib.RegisterJobParams{})
		ids := make([]uuid.UUID, n)
		for i := range ids {
			tk, err := b.svc.SubmitTaskWith(b.ctx, b.alice, "r", "r:modifiers:a", nil, joblib.SubmitOptions{Timeout: secs(1)})
			b.must(err)
			ids[i] = tk.ID
		}
		_, err := b.svc.ClaimTasks(b.ctx, b.alice, w, n, true)
		b.must(err)
		b.rec.take()
		accepted := make([]bool, n)
		done := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				case <-time.After(5 * time.Millisecond):
				}
				if _, err := b.svc.TimeOutTasks(b.ctx, nil, joblib.LeaderFence{}); err != nil {
					t.Error(err)
					return
				}
			}
		})
		var reports sync.WaitGroup
		for i, id := range ids {
			reports.Go(func() {
				time.Sleep(700*time.Millisecond + rand.N(600*time.Millisecond))
				_, err := b.svc.UpdateTask(b.ctx, b.alice, id, models.StatusCompleted, nil)
				switch {
				case err == nil:
					accepted[i] = true
				case !joblib.IsCode(err, joblib.CodeInvalidTaskTransition):
					t.Errorf("report: %v", err)
				}
			})
		}
		reports.Wait()
		deadline := time.Now().Add(10 * time.Second)
		for {
			running := 0
			for _, id := range ids {
				if !taskstatus.Terminal(b.task(id).Status) {
					running++
				}
			}
			if running == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		close(done)
		wg.Wait()
		st := statusEvents(b.rec.take())
		completed := 0
		for i, id := range ids {
			tk := b.task(id)
			want := models.StatusFailed
			if accepted[i] {
				want = models.StatusCompleted
				completed++
			}
			if tk.Status != want {
				t.Fatalf("task %d: %s, report accepted %v", i, tk.Status, accepted[i])
			}
			if evs := st[id.String()]; len(evs) != 1 || evs[0].Status != want {
				t.Fatalf("task %d: terminal events %+v", i, evs)
			}
		}
		t.Logf("%d completed, %d timed out", completed, n-completed)
	})
}

// The submitter cancels held tasks while their worker completes them: one
// of the two wins each task, with one terminal event, and the holder hears
// task_cancelled exactly when the cancel won.
func TestCancelRacingCompletionExactlyOnce(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b := setup(t, db)
		const n = 30
		w := b.timedJob("a", joblib.RegisterJobParams{})
		bob := b.alice
		var err error
		_, bob, err = b.svc.CreateToken(b.ctx, "bob", false)
		b.must(err)
		ids := make([]uuid.UUID, n)
		for i := range ids {
			tk, err := b.svc.SubmitTask(b.ctx, bob, "r", "r:modifiers:a", nil)
			b.must(err)
			ids[i] = tk.ID
		}
		_, err = b.svc.ClaimTasks(b.ctx, b.alice, w, n, true)
		b.must(err)
		b.rec.take()
		cancelled, completed := make([]bool, n), make([]bool, n)
		var wg sync.WaitGroup
		for i, id := range ids {
			wg.Go(func() {
				_, err := b.svc.UpdateTask(b.ctx, bob, id, models.StatusCancelled, nil)
				cancelled[i] = err == nil
				if err != nil && !joblib.IsCode(err, joblib.CodeInvalidTaskTransition) {
					t.Errorf("cancel: %v", err)
				}
			})
			wg.Go(func() {
				_, err := b.svc.UpdateTask(b.ctx, b.alice, id, models.StatusCompleted, nil)
				completed[i] = err == nil
				if err != nil && !joblib.IsCode(err, joblib.CodeInvalidTaskTransition) {
					t.Errorf("complete: %v", err)
				}
			})
		}
		wg.Wait()
		ems := b.rec.take()
		st, cn := statusEvents(ems), cancelledEvents(ems)
		for i, id := range ids {
			if cancelled[i] == completed[i] {
				t.Fatalf("task %d: cancel ok %v, completion ok %v", i, cancelled[i], completed[i])
			}
			want := models.StatusCompleted
			if cancelled[i] {
				want = models.StatusCancelled
			}
			if tk := b.task(id); tk.Status != want {
				t.Fatalf("task %d: %s, want %s", i, tk.Status, want)
			}
			if len(st[id.String()]) != 1 {
				t.Fatalf("task %d: %d status events", i, len(st[id.String()]))
			}
			wantCancel := 0
			if cancelled[i] {
				wantCancel = 1
			}
			if c := cn[id.String()]; len(c) != wantCancel || (wantCancel == 1 && c[0].Room != events.WorkerRoom(w.String())) {
				t.Fatalf("task %d: task_cancelled %+v (cancel won: %v)", i, c, cancelled[i])
			}
		}
	})
}
