package joblib_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// The pending-task quota is exact under one user's concurrent submitters on
// both databases: of 60 parallel submissions with a quota of 25 exactly 25
// are accepted and the others answer quota-exceeded; claiming 5 tasks frees
// exactly 5 slots for the next 20 parallel submissions. On PostgreSQL a
// normal user's submission under a quota is one round trip of two
// statements (the quota lock and the insert), not the general transaction.
func TestPendingQuotaExactUnderConcurrentSubmitters(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		ctx := context.Background()
		var stmts atomic.Int64
		if db.Dialect() == models.Postgres {
			counted, err := models.Open(ctx, db.URL(), models.OpenOptions{Statements: &stmts})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { counted.Close() })
			db = counted
		}
		const quota = 25
		b := setup(t, db, func(s *joblib.Settings) { s.UserMaxPendingTasks = quota; s.SubmitRate = 0 })
		j := jobSpec{name: "Quota"}
		w := b.worker(j)

		burst := func(n int) (accepted, refused int) {
			t.Helper()
			var mu sync.Mutex
			var wg sync.WaitGroup
			for range n {
				wg.Go(func() {
					_, err := b.svc.SubmitTask(ctx, b.alice, "r", j.full(), nil)
					mu.Lock()
					defer mu.Unlock()
					if err == nil {
						accepted++
						return
					}
					if e, ok := joblib.AsError(err); ok && e.Code == joblib.CodeQuotaExceeded {
						refused++
						return
					}
					t.Errorf("submit: %v", err)
				})
			}
			wg.Wait()
			return accepted, refused
		}
		pending := func() int64 {
			t.Helper()
			n, err := b.db.Q(ctx).CountUsage(b.alice.ID, models.UsagePendingTasks, 1000)
			b.must(err)
			return n
		}
		if a, r := burst(60); a != quota || r != 60-quota {
			t.Fatalf("first burst: %d accepted, %d refused; want %d and %d", a, r, quota, 60-quota)
		}
		if n := pending(); n != quota {
			t.Fatalf("%d pending tasks, want %d", n, quota)
		}
		claimed, err := b.svc.ClaimTasks(ctx, b.alice, w, 5, false)
		b.must(err)
		if len(claimed) != 5 {
			t.Fatalf("claimed %d", len(claimed))
		}
		if a, r := burst(20); a != 5 || r != 15 {
			t.Fatalf("second burst: %d accepted, %d refused; want 5 and 15", a, r)
		}
		if n := pending(); n != quota {
			t.Fatalf("%d pending tasks, want %d", n, quota)
		}
		if db.Dialect() == models.Postgres {
			_, err := b.svc.ClaimTasks(ctx, b.alice, w, 1, false)
			b.must(err)
			s0 := stmts.Load()
			_, err = b.svc.SubmitTask(ctx, b.alice, "r", j.full(), nil)
			b.must(err)
			if n := stmts.Load() - s0; n != 2 {
				t.Fatalf("a submission under the quota sent %d statements, want 2 (quota lock and insert)", n)
			}
		}
	})
}
