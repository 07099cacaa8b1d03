package joblib_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// BenchmarkSweep measures one sweep on PostgreSQL over 10,000 workers
// holding 50,000 claimed and running tasks: all stale (the sweep cleans
// them), or none stale (the idle cost of a sweep). It reports the
// statements sent to the database per sweep (BEGIN/COMMIT included).
//
//	go test -run '^$' -bench BenchmarkSweep -benchtime 3x ./joblib
func BenchmarkSweep(b *testing.B) {
	const workers, tasksEach = 10_000, 5
	for _, bc := range []struct {
		name  string
		stale bool
		batch int
	}{
		{"stale/batch=500", true, 500},
		{"stale/batch=1000", true, 1000},
		{"idle", false, 500},
	} {
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
			st := joblib.DefaultSettings()
			st.SweepBatchSize = bc.batch
			svc := joblib.New(joblib.Config{DB: db, Settings: st})
			b.Cleanup(svc.Close)
			_, owner, err := svc.CreateToken(ctx, "owner", false)
			if err != nil {
				b.Fatal(err)
			}
			q := db.Q(ctx)
			job := models.Job{ID: uuid.New(), RoomID: "bench", Category: "modifiers", Name: "j", Schema: "{}", OnWorkerLoss: "fail", MaxAttempts: 1}
			if _, err := q.InsertJobIfAbsent(job); err != nil {
				b.Fatal(err)
			}
			seed := func(age time.Duration) {
				if _, err := q.SeedWorkers(owner.ID, job.ID, workers, tasksEach, age); err != nil {
					b.Fatal(err)
				}
				if _, err := db.Pool.Exec(ctx, "ANALYZE"); err != nil {
					b.Fatal(err)
				}
			}
			if !bc.stale {
				seed(0)
			}
			var total int64
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if bc.stale {
					b.StopTimer()
					seed(2 * time.Minute)
					b.StartTimer()
				}
				before := stmts.Load()
				rep, err := svc.Sweep(ctx, joblib.SweepParams{Threshold: time.Minute})
				total += stmts.Load() - before
				if err != nil {
					b.Fatal(err)
				}
				want := 0
				if bc.stale {
					want = workers
				}
				if rep.Result.Cleaned != want || rep.Result.TasksFailed != want*tasksEach {
					b.Fatalf("cleaned %d workers and %d tasks, want %d and %d", rep.Result.Cleaned, rep.Result.TasksFailed, want, want*tasksEach)
				}
			}
			b.ReportMetric(float64(total)/float64(b.N), "statements/op")
		})
	}
}
