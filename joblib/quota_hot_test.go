package joblib_test

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
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
		db = counting(t, db, &stmts)
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

// A submission counts the user's pending tasks only when the user's pending
// bound leaves no room below the quota, so the bound must never fall below
// the truth: every way pending tasks appear without the quota's count (a
// requeue after a lost worker, an operator's retry of failed tasks,
// creations while no quota applies) makes the next submission count. Each
// case leaves the user with a bound of 2 and 5 pending tasks against a quota
// of 4: a stale bound would accept the next submission. Both databases (the
// one-statement submission on PostgreSQL, the general transaction on SQLite
// and for a batch).
func TestPendingBoundNeverHidesPendingTasks(t *testing.T) {
	t.Parallel()
	const quota = 4
	cases := []struct {
		name string
		// appear brings the user from 2 to 5 pending tasks without a
		// quota count, given a worker holding 3 of the user's tasks
		// (running) and its job.
		appear func(b *bundle, w uuid.UUID, held []uuid.UUID, j jobSpec)
	}{
		{"requeue after a lost worker", func(b *bundle, w uuid.UUID, _ []uuid.UUID, _ jobSpec) {
			res, err := b.svc.DeleteWorker(b.ctx, b.alice, w)
			b.must(err)
			if res.TasksRequeued != 3 {
				b.t.Fatalf("requeued %d tasks, want 3", res.TasksRequeued)
			}
		}},
		{"operator retry", func(b *bundle, _ uuid.UUID, held []uuid.UUID, _ jobSpec) {
			for _, id := range held {
				msg := "boom"
				_, err := b.svc.UpdateTask(b.ctx, b.alice, id, models.StatusFailed, &msg)
				b.must(err)
				_, err = b.svc.RetryTask(b.ctx, id, "cli:ops")
				b.must(err)
			}
		}},
		{"submissions while no quota applies", func(b *bundle, _ uuid.UUID, _ []uuid.UUID, j jobSpec) {
			withoutQuota(b, func() {
				for range 3 {
					b.submit(j)
				}
			})
		}},
		{"a batch while no quota applies", func(b *bundle, _ uuid.UUID, _ []uuid.UUID, j jobSpec) {
			withoutQuota(b, func() {
				_, err := b.svc.Submit(b.ctx, b.alice, joblib.Submission{Room: "r", FullName: j.full(), Payloads: []json.RawMessage{nil, nil, nil}, Batch: true})
				b.must(err)
			})
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dbtest.Each(t, func(t *testing.T, db *models.DB) {
				b := setup(t, db, func(s *joblib.Settings) { s.UserMaxPendingTasks = quota; s.SubmitRate = 0 })
				j := jobSpec{name: "Bound" + uuid.NewString()[:8], policy: joblib.OnWorkerLossRequeue, attempts: 5}
				w := b.worker(j)
				b.worker(j) // keeps the job alive when w goes
				bound := func() any {
					t.Helper()
					n, ok, err := b.db.Q(b.ctx).PendingBound(b.alice.ID)
					b.must(err)
					if !ok {
						return nil
					}
					return n
				}
				// 3 submitted (the first counts: bound 1, 2, 3) and held
				// by w: 0 pending.
				var held []uuid.UUID
				for range 3 {
					b.submit(j)
					id := b.claim(w)
					_, err := b.svc.UpdateTask(b.ctx, b.alice, id, models.StatusRunning, nil)
					b.must(err)
					held = append(held, id)
				}
				// One from the bound (3 → 4), one counted (bound 4 is at the
				// quota; 1 pending: bound 2).
				b.submit(j)
				b.submit(j)
				if got := bound(); got != int64(2) {
					t.Fatalf("bound %v after a count of 1 and one more task, want 2", got)
				}
				c.appear(b, w, held, j)
				if n, err := b.db.Q(b.ctx).CountUsage(b.alice.ID, models.UsagePendingTasks, 100); err != nil || n != 5 {
					t.Fatalf("%d pending tasks (%v), want 5", n, err)
				}
				_, err := b.svc.SubmitTask(b.ctx, b.alice, "r", j.full(), nil)
				if !joblib.IsCode(err, joblib.CodeQuotaExceeded) {
					t.Fatalf("a submission with 5 pending tasks and a quota of 4: %v, want quota-exceeded", err)
				}
				_, err = b.svc.Submit(b.ctx, b.alice, joblib.Submission{Room: "r", FullName: j.full(), Payloads: []json.RawMessage{nil, nil}, Batch: true})
				if !joblib.IsCode(err, joblib.CodeQuotaExceeded) {
					t.Fatalf("a batch of 2 with 5 pending tasks and a quota of 4: %v, want quota-exceeded", err)
				}
			})
		})
	}
}

// withoutQuota runs f with the pending-task quota switched off, as on a node
// configured without one.
func withoutQuota(b *bundle, f func()) {
	st := b.svc.Settings()
	old := st.UserMaxPendingTasks
	st.UserMaxPendingTasks = 0
	b.svc.SetSettings(st)
	f()
	st.UserMaxPendingTasks = old
	b.svc.SetSettings(st)
}
