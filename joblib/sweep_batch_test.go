package joblib_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// A sweep that cleans many stale workers in several batches ends in exactly
// the state one CleanupWorker per worker would: every stale worker, its
// links and providers gone, each of its tasks failed or requeued per job
// policy with the worker kept as lost_worker_id, the job nobody serves
// soft-deleted and the others kept, one audit row per worker, and exactly
// one status event per lost task (none for anything else). The live worker
// and its task are untouched, and the task counts the triggers keep match
// the tasks.
func TestBatchedSweepEndStateAndEventsExactlyOnce(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		const stale, batch = 23, 7 // four batches, the last one short
		b := setup(t, db, func(s *joblib.Settings) { s.SweepBatchSize = batch })
		timeout := time.Minute
		failJob := jobSpec{name: "fail", policy: joblib.OnWorkerLossFail}
		reqJob := jobSpec{name: "requeue", policy: joblib.OnWorkerLossRequeue, attempts: 3}
		shared := jobSpec{name: "shared", policy: joblib.OnWorkerLossFail}

		live := b.worker(shared)
		liveTask := b.submit(shared)
		if got := b.claim(live); got != liveTask {
			t.Fatalf("live worker claimed %s, want %s", got, liveTask)
		}
		ws := make([]uuid.UUID, stale)
		failed := map[uuid.UUID]uuid.UUID{}   // task -> worker
		requeued := map[uuid.UUID]uuid.UUID{} // task -> worker
		for i := range ws {
			ws[i] = b.worker(failJob, reqJob, shared)
			if i%3 == 0 {
				_, _, err := b.svc.RegisterProvider(b.ctx, b.alice, "p", joblib.RegisterProviderParams{
					Category: "frames", Name: fmt.Sprintf("prov%d", i), WorkerID: &ws[i]})
				b.must(err)
			}
			f, q := b.submit(failJob), b.submit(reqJob)
			// FIFO across the worker's jobs: the older task first.
			if got := b.claim(ws[i]); got != f {
				t.Fatalf("claimed %s, want %s", got, f)
			}
			if got := b.claim(ws[i]); got != q {
				t.Fatalf("claimed %s, want %s", got, q)
			}
			_, err := b.svc.UpdateTask(b.ctx, b.alice, q, models.StatusRunning, nil)
			b.must(err)
			failed[f], requeued[q] = ws[i], ws[i]
		}
		// Keep one requeue-policy task pending so that job stays alive.
		keep := b.submit(reqJob)
		b.age(ws, 2*timeout)
		b.rec.take()

		rep, err := b.svc.Sweep(b.ctx, joblib.SweepParams{Threshold: timeout})
		b.must(err)
		r := rep.Result
		if r.Cleaned != stale || r.TasksFailed != stale || r.TasksRequeued != stale || r.OrphanJobs != 1 {
			t.Fatalf("sweep result: cleaned %d, failed %d, requeued %d, orphan jobs %d; want %d, %d, %d, 1",
				r.Cleaned, r.TasksFailed, r.TasksRequeued, r.OrphanJobs, stale, stale, stale)
		}
		if len(r.FrameRooms) != 1 || r.FrameRooms[0] != "p" {
			t.Fatalf("frame rooms %v, want [p]", r.FrameRooms)
		}

		// The end state, row by row.
		if !b.workerExists(live) {
			t.Fatal("the live worker was cleaned")
		}
		if tk := b.task(liveTask); tk.Status != models.StatusClaimed || tk.WorkerID == nil || *tk.WorkerID != live {
			t.Fatalf("live worker's task: %s worker %v", tk.Status, tk.WorkerID)
		}
		if tk := b.task(keep); tk.Status != models.StatusPending || tk.LostWorkerID != nil {
			t.Fatalf("pending task touched: %s lost %v", tk.Status, tk.LostWorkerID)
		}
		for _, w := range ws {
			if b.workerExists(w) {
				t.Fatalf("stale worker %s survived", w)
			}
			es := b.events(w)
			if len(es) != 1 || es[0].SweepID == nil || *es[0].SweepID != rep.SweepID || es[0].TasksFailed != 1 || es[0].TasksRequeued != 1 || es[0].Shadow {
				t.Fatalf("worker %s audit rows %+v", w, es)
			}
		}
		for id, w := range failed {
			tk := b.task(id)
			if tk.Status != models.StatusFailed || tk.Error == nil || *tk.Error != joblib.ErrWorkerDisconnected ||
				tk.LostWorkerID == nil || *tk.LostWorkerID != w || !tk.CompletedAt.Valid() || tk.Attempt != 1 {
				t.Fatalf("fail-policy task %s: %s error %v lost %v completed %v attempt %d", id, tk.Status, tk.Error, tk.LostWorkerID, tk.CompletedAt, tk.Attempt)
			}
		}
		for id, w := range requeued {
			tk := b.task(id)
			if tk.Status != models.StatusPending || tk.WorkerID != nil || tk.ClaimedAt.Valid() || tk.StartedAt.Valid() || tk.CompletedAt.Valid() ||
				tk.Error != nil || tk.LostWorkerID == nil || *tk.LostWorkerID != w || tk.Attempt != 1 {
				t.Fatalf("requeue-policy task %s: %+v", id, tk)
			}
		}
		q := db.Q(b.ctx)
		for _, j := range []struct {
			spec    jobSpec
			deleted bool
		}{{failJob, true}, {reqJob, false}, {shared, false}} {
			job, err := q.JobByKey("r", "modifiers", j.spec.name)
			b.must(err)
			if job.Deleted != j.deleted {
				t.Fatalf("job %s deleted=%v, want %v", j.spec.name, job.Deleted, j.deleted)
			}
		}
		provs, err := b.svc.ListProviders(b.ctx, "p", joblib.PageParams{Limit: 100})
		b.must(err)
		if provs.Total != 0 {
			t.Fatalf("%d providers of cleaned workers left", provs.Total)
		}

		// Exactly one status event per lost task, as it ended; the requeued
		// ones carry their queue position and announce themselves once.
		ems := b.rec.take()
		status := statusEvents(ems)
		if len(status) != 2*stale {
			t.Fatalf("status events for %d tasks, want %d", len(status), 2*stale)
		}
		for id := range failed {
			if evs := status[id.String()]; len(evs) != 1 || evs[0].Status != models.StatusFailed || evs[0].Error == nil {
				t.Fatalf("task %s status events %+v, want one failed", id, evs)
			}
		}
		for id := range requeued {
			if evs := status[id.String()]; len(evs) != 1 || evs[0].Status != models.StatusPending || evs[0].QueuePosition == nil || evs[0].WorkerID != nil {
				t.Fatalf("task %s status events %+v, want one pending with a queue position", id, evs)
			}
		}
		available := map[string]int{}
		providersInvalidated := 0
		for _, e := range ems {
			switch ev := e.Event.(type) {
			case events.TaskAvailable:
				available[ev.TaskID]++
			case events.ProvidersInvalidate:
				if e.Room == events.Room("p") {
					providersInvalidated++
				}
			}
		}
		if len(available) != stale {
			t.Fatalf("task_available for %d tasks, want %d", len(available), stale)
		}
		for id, n := range available {
			if n != 1 {
				t.Fatalf("task %s announced %d times", id, n)
			}
		}
		if providersInvalidated == 0 {
			t.Fatal("no providers_invalidate for the room that lost its providers")
		}

		// The counts the triggers keep match the tasks.
		counts, err := q.CountTasksByStatus()
		b.must(err)
		want := map[string]int64{models.StatusFailed: stale, models.StatusPending: stale + 1, models.StatusClaimed: 1}
		for st, n := range want {
			if counts[st] != n {
				t.Fatalf("task counts %v, want %v", counts, want)
			}
		}
		if counts[models.StatusRunning] != 0 {
			t.Fatalf("task counts %v: running left", counts)
		}

		// A second sweep finds nothing and publishes nothing.
		rep, err = b.svc.Sweep(b.ctx, joblib.SweepParams{Threshold: timeout})
		b.must(err)
		if rep.Result.Cleaned != 0 || len(rep.StuckInternal) != 0 {
			t.Fatalf("second sweep %+v", rep.Result)
		}
		if ems := b.rec.take(); len(ems) != 0 {
			t.Fatalf("second sweep published %d events", len(ems))
		}
	})
}
