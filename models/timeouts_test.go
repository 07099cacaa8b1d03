package models_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/models"
)

// A task's deadline is set, moved and judged on the database's clock only:
// with the database an hour ahead of or behind the process, a task claimed
// 59 s ago (of a 60 s task_timeout) is neither found by the idle probe, nor
// timed out, nor refused a report, and one claimed 61 s ago is all three.
func TestTaskDeadlinesIgnoreProcessClock(t *testing.T) {
	t.Parallel()
	for _, c := range skewCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db := c.open(t)
			f := newFixture(t, db)
			j := f.job("J", "fail", 1)
			limit := 60
			f.must(f.q.SetJobTimeouts(j.ID, &limit, nil, "fail"))
			w := f.worker(j)
			young, old := f.task(j), f.task(j)
			for range 2 {
				if _, ok := f.claim(w); !ok {
					t.Fatal("nothing claimed")
				}
			}
			if tk := f.get(young); tk.DeadlineAt.Sub(tk.ClaimedAt.Time) != time.Minute {
				t.Fatalf("deadline %s after the claim, want 1m", tk.DeadlineAt.Sub(tk.ClaimedAt.Time))
			}
			f.must(f.q.SetTaskClaimAge([]uuid.UUID{young}, 59*time.Second))
			probe := func() bool {
				p, err := f.q.ProbeSweep(time.Hour, time.Hour)
				f.must(err)
				return p.TimedOut
			}
			if probe() {
				t.Fatal("the probe finds a task 1 s before its deadline")
			}
			f.must(f.q.SetTaskClaimAge([]uuid.UUID{old}, 61*time.Second))
			if !probe() {
				t.Fatal("the probe misses a task 1 s past its deadline")
			}
			ok, err := f.q.TransitionTask(old, models.StatusClaimed, models.StatusRunning, nil, nil)
			f.must(err)
			if ok {
				t.Fatal("a report past the deadline was applied")
			}
			ok, err = f.q.TransitionTask(young, models.StatusClaimed, models.StatusRunning, nil, nil)
			f.must(err)
			if !ok {
				t.Fatal("a report before the deadline was refused")
			}
			out, err := f.q.TimeOutTasks(10, "task_timeout", "test", nil, models.LeaderFence{})
			f.must(err)
			if len(out) != 1 || out[0].ID != old || out[0].Status != models.StatusFailed || out[0].Limit != models.LimitTask || out[0].HeldBy != w {
				t.Fatalf("timed out %+v, want only %s", out, old)
			}
			if age := out[0].DBNow.Sub(out[0].ClaimedAt.Time); age < 61*time.Second || age > 2*time.Minute {
				t.Fatalf("evidence: db_now - claimed_at = %s", age)
			}
			if tk := f.get(young); tk.Status != models.StatusRunning {
				t.Fatalf("the young task is %s", tk.Status)
			}
		})
	}
}
