package joblib_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// Concurrent status reports of one user's workers, on both databases: 16
// reporters take 120 held tasks through running and completed, each report
// answered with its own task in the status it asked for, every task ends
// completed with exactly one status event per change, and on PostgreSQL the
// reports share statements (group commit): fewer statements than reports.
func TestConcurrentReportsAreEachAppliedOnce(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		ctx := context.Background()
		var stmts atomic.Int64
		db = counting(t, db, &stmts)
		b := setup(t, db, func(s *joblib.Settings) { s.SubmitRate = 0 })
		j := jobSpec{name: "Reports"}
		const workers, each = 4, 30
		var held []uuid.UUID
		for range workers {
			w := b.worker(j)
			for range each {
				b.submit(j)
			}
			ts, err := b.svc.ClaimTasks(ctx, b.alice, w, each, false)
			b.must(err)
			if len(ts) != each {
				t.Fatalf("claimed %d, want %d", len(ts), each)
			}
			for _, tk := range ts {
				held = append(held, tk.ID)
			}
		}
		b.rec.take()
		s0 := stmts.Load()
		todo := make(chan uuid.UUID, len(held))
		for _, id := range held {
			todo <- id
		}
		close(todo)
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for id := range todo {
					for _, st := range []string{models.StatusRunning, models.StatusCompleted} {
						tk, err := b.svc.UpdateTask(ctx, b.alice, id, st, nil)
						if err != nil || tk.ID != id || tk.Status != st {
							t.Errorf("report %s of %s: got %s %s, %v", st, id, tk.ID, tk.Status, err)
						}
					}
				}
			})
		}
		wg.Wait()
		sent := stmts.Load() - s0
		evs := statusEvents(b.rec.take())
		for _, id := range held {
			if got := b.task(id).Status; got != models.StatusCompleted {
				t.Errorf("task %s ended %s", id, got)
			}
			if e := evs[id.String()]; len(e) != 2 || e[0].Status != models.StatusRunning || e[1].Status != models.StatusCompleted {
				t.Errorf("task %s: status events %+v, want running then completed", id, e)
			}
		}
		if db.Dialect() == models.Postgres && sent >= int64(2*len(held)) {
			t.Errorf("%d reports sent %d statements: none shared one", 2*len(held), sent)
		}
		t.Logf("%d reports, %d statements", 2*len(held), sent)
	})
}
