package joblib_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// BenchmarkSubmit10000 submits 10,000 tasks of one user on PostgreSQL in
// one run, alternately as 10,000 single submits and as 10 batches of 1,000,
// each on a fresh schema, and reports the tasks per second of each (service
// level, no HTTP).
//
//	go test -run '^$' -bench BenchmarkSubmit10000 -benchtime 1x ./joblib
func BenchmarkSubmit10000(b *testing.B) {
	const n = 10_000
	for _, mode := range []string{"single", "batch1000"} {
		b.Run(mode, func(b *testing.B) {
			ctx := context.Background()
			for range b.N {
				b.StopTimer()
				db := dbtest.Open(b, models.Postgres)
				bd := setup(b, db)
				w, err := bd.svc.CreateWorker(ctx, bd.alice)
				if err != nil {
					b.Fatal(err)
				}
				if _, _, err := bd.svc.RegisterJob(ctx, bd.alice, "r", joblib.RegisterJobParams{Category: "modifiers", Name: "j", WorkerID: &w.ID}); err != nil {
					b.Fatal(err)
				}
				payload := json.RawMessage(`{"frame": 1}`)
				batch := make([]json.RawMessage, 1000)
				for i := range batch {
					batch[i] = payload
				}
				b.StartTimer()
				start := time.Now()
				if mode == "single" {
					for range n {
						if _, err := bd.svc.SubmitTask(ctx, bd.alice, "r", "r:modifiers:j", payload); err != nil {
							b.Fatal(err)
						}
					}
				} else {
					for range n / len(batch) {
						if _, err := bd.svc.Submit(ctx, bd.alice, joblib.Submission{Room: "r", FullName: "r:modifiers:j", Payloads: batch, Batch: true}); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.ReportMetric(n/time.Since(start).Seconds(), "tasks/s")
			}
		})
	}
}
