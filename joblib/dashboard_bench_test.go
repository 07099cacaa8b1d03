package joblib_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// BenchmarkDashboard measures one dashboard snapshot on PostgreSQL: over an
// empty database (the baseline of the same run), and over 10,000 workers
// holding 50,000 claimed and running tasks, with 50,000 pending and 100,000
// completed tasks beside them. It reports the statements per snapshot.
//
//	go test -run '^$' -bench BenchmarkDashboard -benchtime 20x ./joblib
func BenchmarkDashboard(b *testing.B) {
	for _, bc := range []struct {
		name  string
		fleet bool
	}{{"empty", false}, {"workers=10k,tasks=200k", true}} {
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
			svc := joblib.New(joblib.Config{DB: db, Settings: joblib.DefaultSettings()})
			b.Cleanup(svc.Close)
			if bc.fleet {
				_, owner, err := svc.CreateToken(ctx, "owner", false)
				if err != nil {
					b.Fatal(err)
				}
				q := db.Q(ctx)
				job := models.Job{ID: uuid.New(), RoomID: "bench", Category: "modifiers", Name: "j", Schema: "{}", OnWorkerLoss: "fail", MaxAttempts: 1}
				if _, err := q.InsertJobIfAbsent(job); err != nil {
					b.Fatal(err)
				}
				if _, err := q.SeedWorkers(owner.ID, job.ID, 10_000, 5, 0); err != nil {
					b.Fatal(err)
				}
				if err := q.SeedPendingTasks(job.ID, "bench", 150_000); err != nil {
					b.Fatal(err)
				}
				if _, err := db.Pool.Exec(ctx, "UPDATE tasks SET status = 'completed', completed_at = now() WHERE id IN (SELECT id FROM tasks WHERE status = 'pending' LIMIT 100000)"); err != nil {
					b.Fatal(err)
				}
				if _, err := db.Pool.Exec(ctx, "ANALYZE"); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := svc.Dashboard(ctx); err != nil { // warm up
				b.Fatal(err)
			}
			before := stmts.Load()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				d, err := svc.Dashboard(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if bc.fleet && (d.Totals.Workers != 10_000 || len(d.Workers) != joblib.DashMaxWorkers || d.Totals.Tasks["completed"] != 100_000) {
					b.Fatalf("snapshot: %d workers (%d listed), %v", d.Totals.Workers, len(d.Workers), d.Totals.Tasks)
				}
			}
			b.ReportMetric(float64(stmts.Load()-before)/float64(b.N), "statements/op")
		})
	}
}
