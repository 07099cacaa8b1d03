package joblib_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// A disconnect cleanup for a socket session the worker has since replaced
// (it bound again: a new epoch) is a no-op: the worker, its claimed task
// and its job stay, no audit row is written and nothing is published.
func TestOldEpochCleanupAfterRebindIsNoop(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b := setup(t, db)
		job := jobSpec{name: "j", policy: joblib.OnWorkerLossFail}
		w := b.worker(job)
		old, err := b.svc.BindWorker(b.ctx, w)
		b.must(err)
		tk := b.submit(job)
		b.claim(w)
		if _, err := b.svc.BindWorker(b.ctx, w); err != nil {
			t.Fatal(err)
		}
		b.rec.take()

		res, err := b.svc.CleanupWorker(b.ctx, w, joblib.DisconnectCleanup(old))
		b.must(err)
		if res.Cleaned != 0 || res.TasksFailed != 0 || res.TasksRequeued != 0 {
			t.Fatalf("old-epoch cleanup acted: %d workers cleaned, %d tasks failed", res.Cleaned, res.TasksFailed)
		}
		if !b.workerExists(w) {
			t.Fatal("old-epoch cleanup removed the re-bound worker")
		}
		if got := b.task(tk); got.Status != models.StatusClaimed || got.WorkerID == nil || *got.WorkerID != w {
			t.Fatalf("claimed task after old-epoch cleanup: %s by %v", got.Status, got.WorkerID)
		}
		if es := b.events(w); len(es) != 0 {
			t.Fatalf("old-epoch cleanup wrote audit rows: %+v", es)
		}
		if ems := b.rec.take(); len(ems) != 0 {
			t.Fatalf("old-epoch cleanup published %d events", len(ems))
		}
		if _, err := b.svc.GetJob(b.ctx, "r", job.full()); err != nil {
			t.Fatalf("job after old-epoch cleanup: %v", err)
		}
	})
}

// Events are published after commit, also on one node: a subscriber that
// reads the database inside its handler finds the state the event announces
// (a task's status; a cleaned worker gone, its task failed). On SQLite,
// publishing inside the transaction would even leave the handler's read
// waiting for the single connection: its bounded read fails instead.
func TestSubscriberSeesCommittedState(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b := setup(t, db)
		var (
			mu       sync.Mutex
			problems []string
			seen     int
		)
		unsub := b.svc.Bus().Subscribe(func(e events.Emission) {
			ev, ok := e.Event.(events.TaskStatusEvent)
			if !ok {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			var problem string
			tk, err := db.Q(ctx).GetTask(uuid.MustParse(ev.ID))
			switch {
			case err != nil:
				problem = fmt.Sprintf("%s event of task %s: reading the task failed: %v", ev.Status, ev.ID, err)
			case tk.Status != ev.Status:
				problem = fmt.Sprintf("%s event of task %s: the database says %s", ev.Status, ev.ID, tk.Status)
			case ev.Status == models.StatusFailed && tk.LostWorkerID != nil:
				if _, err := db.Q(ctx).GetWorker(*tk.LostWorkerID); err != models.ErrNotFound {
					problem = fmt.Sprintf("failed event of task %s: its lost worker is still there (%v)", ev.ID, err)
				}
			}
			mu.Lock()
			seen++
			if problem != "" {
				problems = append(problems, problem)
			}
			mu.Unlock()
		})
		t.Cleanup(unsub)

		job := jobSpec{name: "j", policy: joblib.OnWorkerLossFail}
		w := b.worker(job)
		done := b.submit(job) // pending
		b.claim(w)            // claimed
		for _, st := range []string{models.StatusRunning, models.StatusCompleted} {
			_, err := b.svc.UpdateTask(b.ctx, b.alice, done, st, nil)
			b.must(err)
		}
		lostTask := b.submit(job)
		b.claim(w)
		_, err := b.svc.DeleteWorker(b.ctx, b.alice, w) // failed, by the cleanup
		b.must(err)

		mu.Lock()
		defer mu.Unlock()
		if seen != 7 {
			t.Errorf("subscriber saw %d status events, want 7", seen)
		}
		for _, p := range problems {
			t.Error(p)
		}
		if got := b.task(lostTask); got.Status != models.StatusFailed {
			t.Fatalf("task of the deleted worker is %s", got.Status)
		}
	})
}

// Cleaning one worker of a job leaves the job's other worker linked: the job
// stays live and the other worker claims the next task.
func TestCleaningOneWorkerKeepsOthersOfTheJob(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b := setup(t, db)
		job := jobSpec{name: "shared", policy: joblib.OnWorkerLossFail}
		gone, stays := b.worker(job), b.worker(job)
		for _, path := range []string{"delete", "sweep"} {
			if path == "delete" {
				_, err := b.svc.DeleteWorker(b.ctx, b.alice, gone)
				b.must(err)
			} else {
				gone = b.worker(job)
				b.age([]uuid.UUID{gone}, 2*b.svc.Settings().WorkerTimeout)
				rep, err := b.svc.Sweep(b.ctx, joblib.SweepParams{})
				b.must(err)
				if rep.Result.Cleaned != 1 {
					t.Fatalf("sweep cleaned %d workers, want 1", rep.Result.Cleaned)
				}
			}
			j, err := b.svc.GetJob(b.ctx, "r", job.full())
			if err != nil {
				t.Fatalf("%s: job after cleaning one of its workers: %v", path, err)
			}
			if len(j.Workers) != 1 || j.Workers[0] != stays {
				t.Fatalf("%s: job workers %v, want [%s]", path, j.Workers, stays)
			}
			tk := b.submit(job)
			if got := b.claim(stays); got != tk {
				t.Fatalf("%s: the remaining worker claimed %s, want %s", path, got, tk)
			}
		}
	})
}
