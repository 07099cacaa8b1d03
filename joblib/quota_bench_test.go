package joblib_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// BenchmarkSubmitQuota measures one task submission on PostgreSQL by a
// regular user who already has 5,000 pending tasks, with the pending-task
// quota on (the default 10,000: a user row lock and a bounded count per
// submission) and off (0), and reports statements per submission.
//
//	go test -run '^$' -bench BenchmarkSubmitQuota -benchtime 2000x ./joblib
func BenchmarkSubmitQuota(b *testing.B) {
	for _, bc := range []struct {
		name  string
		quota int
	}{{"quota=off", 0}, {"quota=10000", 10000}} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			var stmts atomic.Int64
			db, err := models.Open(ctx, dbtest.URL(b, models.Postgres), models.OpenOptions{Statements: &stmts})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { db.Close() })
			if _, err := db.Migrate(ctx); err != nil {
				b.Fatal(err)
			}
			bd := setup(b, db, func(s *joblib.Settings) { s.UserMaxPendingTasks = bc.quota })
			w, err := bd.svc.CreateWorker(ctx, bd.alice)
			if err != nil {
				b.Fatal(err)
			}
			if _, _, err := bd.svc.RegisterJob(ctx, bd.alice, "r", joblib.RegisterJobParams{Category: "modifiers", Name: "j", WorkerID: &w.ID}); err != nil {
				b.Fatal(err)
			}
			for range 5000 {
				if _, err := bd.svc.SubmitTask(ctx, bd.alice, "r", "r:modifiers:j", nil); err != nil {
					b.Fatal(err)
				}
			}
			stmts.Store(0)
			b.ResetTimer()
			for range b.N {
				if _, err := bd.svc.SubmitTask(ctx, bd.alice, "r", "r:modifiers:j", nil); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(stmts.Load())/float64(b.N), "stmts/op")
		})
	}
}
