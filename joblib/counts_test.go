package joblib_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// The task counts (joblib_tasks{status}) equal the tasks, per status, after
// concurrent submissions, single and batch claims (some starting their
// tasks), reports one at a time and in batches, terminal reports that end
// tasks from claimed and from running, late reports that change nothing,
// and cancellations through the general path, all at once. On PostgreSQL
// the hot statements count their own changes and the statement trigger
// counts the rest: a change counted twice, or by neither, shows here.
func TestTaskCountsExactUnderConcurrentWriters(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		ctx := context.Background()
		b := setup(t, db, func(s *joblib.Settings) { s.UserMaxPendingTasks = 0; s.SubmitRate = 0 })
		j := jobSpec{name: "Counted"}
		const workers, submitters, perSubmitter = 4, 4, 30
		wids := make([]uuid.UUID, workers)
		for i := range wids {
			wids[i] = b.worker(j)
		}
		var wg sync.WaitGroup
		fail := func(what string, err error) {
			if err != nil {
				t.Errorf("%s: %v", what, err)
			}
		}
		for range submitters {
			wg.Go(func() {
				for range perSubmitter {
					_, err := b.svc.SubmitTask(ctx, b.alice, "r", j.full(), nil)
					fail("submit", err)
				}
			})
		}
		// Each worker takes tasks its own way until the queue stays empty
		// after the submitters are done.
		var submitted sync.WaitGroup
		submitted.Add(1)
		go func() { wg.Wait(); submitted.Done() }()
		var ww sync.WaitGroup
		for i, w := range wids {
			ww.Go(func() {
				msg := "boom"
				for n := 0; ; n++ {
					var ts []joblib.Task
					var err error
					switch i {
					case 0:
						var one *joblib.Task
						one, err = b.svc.ClaimTask(ctx, b.alice, w)
						if one != nil {
							ts = append(ts, *one)
						}
					default:
						ts, err = b.svc.ClaimTasks(ctx, b.alice, w, 3, i == 2)
					}
					if err != nil {
						t.Errorf("claim: %v", err)
						return
					}
					if len(ts) == 0 {
						done := make(chan struct{})
						go func() { submitted.Wait(); close(done) }()
						select {
						case <-done:
							// One more look: the last submissions may have
							// landed after this claim.
							if more, err := b.svc.ClaimTasks(ctx, b.alice, w, 1, false); err != nil || len(more) > 0 {
								if err != nil {
									t.Errorf("claim: %v", err)
									return
								}
								ts = more
							} else {
								return
							}
						case <-time.After(2 * time.Millisecond):
							// The queue is empty for now: look again soon,
							// without spinning claims that starve the
							// submitters of SQLite's one writer.
							continue
						}
					}
					for k, task := range ts {
						switch (n + k) % 4 {
						case 0: // claimed → failed
							_, err := b.svc.UpdateTask(ctx, b.alice, task.ID, models.StatusFailed, &msg)
							fail("fail from claimed", err)
						case 1: // running → completed, in one batch with a late duplicate
							if task.Status != models.StatusRunning {
								_, err := b.svc.UpdateTask(ctx, b.alice, task.ID, models.StatusRunning, nil)
								fail("start", err)
							}
							_, err := b.svc.UpdateTasks(ctx, b.alice, []joblib.TaskUpdate{{TaskID: task.ID, Status: models.StatusCompleted}})
							fail("complete", err)
							if _, err := b.svc.UpdateTask(ctx, b.alice, task.ID, models.StatusRunning, nil); err == nil {
								t.Errorf("a completed task %s went back to running", task.ID)
							}
						case 2: // running → failed
							if task.Status != models.StatusRunning {
								_, err := b.svc.UpdateTask(ctx, b.alice, task.ID, models.StatusRunning, nil)
								fail("start", err)
							}
							_, err := b.svc.UpdateTask(ctx, b.alice, task.ID, models.StatusFailed, &msg)
							fail("fail from running", err)
						default: // cancelled by an operator: the general path
							_, err := b.svc.CancelTask(ctx, task.ID, "admin")
							fail("cancel", err)
						}
					}
				}
			})
		}
		ww.Wait()
		if t.Failed() {
			return
		}
		q := db.Q(ctx)
		counts, err := q.CountTasksByStatus()
		b.must(err)
		total := int64(0)
		for _, st := range []string{models.StatusPending, models.StatusClaimed, models.StatusRunning, models.StatusCompleted, models.StatusFailed, models.StatusCancelled} {
			_, n, err := q.ListTasks(models.TaskFilter{Status: st}, models.Page{Limit: 1})
			b.must(err)
			if counts[st] != n {
				t.Errorf("count of %s tasks is %d, want %d (all counts %v)", st, counts[st], n, counts)
			}
			total += n
		}
		if total != submitters*perSubmitter {
			t.Errorf("%d tasks, want %d", total, submitters*perSubmitter)
		}
		if counts[models.StatusPending]+counts[models.StatusClaimed]+counts[models.StatusRunning] != 0 {
			t.Errorf("tasks left unfinished: %v", counts)
		}
	})
}
