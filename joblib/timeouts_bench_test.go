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

// BenchmarkSweepTimeouts measures one sweep on PostgreSQL over 10,000 held
// tasks of 1,000 live workers: all past their deadline (the sweep times
// them out, in batches of 500), or none (the idle cost of a sweep: its one
// read). It reports the statements sent per sweep (BEGIN/COMMIT included).
//
//	go test -run '^$' -bench BenchmarkSweepTimeouts -benchtime 3x ./joblib
func BenchmarkSweepTimeouts(b *testing.B) {
	const workers, tasksEach = 1_000, 10
	for _, stuck := range []bool{true, false} {
		name := "idle"
		if stuck {
			name = "stuck=10000"
		}
		b.Run(name, func(b *testing.B) {
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
			_, owner, err := svc.CreateToken(ctx, "owner", false)
			if err != nil {
				b.Fatal(err)
			}
			q := db.Q(ctx)
			job := models.Job{ID: uuid.New(), RoomID: "bench", Category: "modifiers", Name: "j", Schema: "{}", OnWorkerLoss: "fail", MaxAttempts: 1}
			if _, err := q.InsertJobIfAbsent(job); err != nil {
				b.Fatal(err)
			}
			seed := func() {
				if _, err := q.SeedWorkers(owner.ID, job.ID, workers, tasksEach, 0); err != nil {
					b.Fatal(err)
				}
				deadline := "now() + interval '1 hour'"
				if stuck {
					deadline = "now() - interval '1 second'"
				}
				if _, err := db.Pool.Exec(ctx, "UPDATE tasks SET task_timeout = 60, claimed_at = now() - interval '61 seconds', deadline_at = "+deadline+
					" WHERE status IN ('claimed', 'running')"); err != nil {
					b.Fatal(err)
				}
				if _, err := db.Pool.Exec(ctx, "ANALYZE"); err != nil {
					b.Fatal(err)
				}
			}
			if !stuck {
				seed()
			}
			var total int64
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				if stuck {
					if _, err := db.Pool.Exec(ctx, "DELETE FROM tasks; DELETE FROM worker_job_links; DELETE FROM workers; DELETE FROM audit_log"); err != nil {
						b.Fatal(err)
					}
					seed()
				}
				before := stmts.Load()
				b.StartTimer()
				rep, err := svc.Sweep(ctx, joblib.SweepParams{Threshold: time.Minute})
				total += stmts.Load() - before
				if err != nil {
					b.Fatal(err)
				}
				want := 0
				if stuck {
					want = workers * tasksEach
				}
				if len(rep.TimedOut) != want || rep.Result.Cleaned != 0 {
					b.Fatalf("timed out %d tasks, cleaned %d workers; want %d and 0", len(rep.TimedOut), rep.Result.Cleaned, want)
				}
			}
			b.ReportMetric(float64(total)/float64(b.N), "statements/op")
		})
	}
}
