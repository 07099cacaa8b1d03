package joblib_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// The sweeper, the disconnect handler and graceful deletes race on the same
// workers, round after round: every worker is cleaned exactly once, with one
// audit row, each lost task gets exactly one status event and ends in exactly
// one state, and the job nobody serves any more is soft-deleted.
func TestCleanupPathsRaceExactlyOnce(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b := setup(t, db)
		const rounds, perRound = 40, 4
		timeout := b.svc.Settings().WorkerTimeout
		for round := range rounds {
			failJob := jobSpec{name: "fail" + uuid.NewString()[:8], policy: joblib.OnWorkerLossFail}
			requeueJob := jobSpec{name: "requeue" + uuid.NewString()[:8], policy: joblib.OnWorkerLossRequeue, attempts: 3}
			ws := make([]uuid.UUID, perRound)
			epochs := make([]int64, perRound)
			var failTasks, requeueTasks []uuid.UUID
			for i := range ws {
				ws[i] = b.worker(failJob, requeueJob)
				failTasks = append(failTasks, b.submit(failJob))
				requeueTasks = append(requeueTasks, b.submit(requeueJob))
				// Claim both (FIFO across the worker's jobs), start one.
				first, second := b.claim(ws[i]), b.claim(ws[i])
				_, err := b.svc.UpdateTask(b.ctx, b.alice, first, models.StatusRunning, nil)
				b.must(err)
				_ = second
				epochs[i], err = b.svc.BindWorker(b.ctx, ws[i])
				b.must(err)
			}
			b.age(ws, 2*timeout)
			b.rec.take()

			var cleaned atomic.Int64
			start := make(chan struct{})
			var wg sync.WaitGroup
			errs := make(chan error, 3*perRound+1)
			wg.Go(func() {
				<-start
				rep, err := b.svc.Sweep(b.ctx, joblib.SweepParams{Threshold: timeout})
				errs <- err
				cleaned.Add(int64(rep.Result.Cleaned))
			})
			for i, w := range ws {
				wg.Go(func() {
					<-start
					r, err := b.svc.CleanupWorker(b.ctx, w, joblib.CleanupParams{Path: joblib.PathDisconnect, Fence: models.CleanupFence{Epoch: &epochs[i]}})
					errs <- err
					cleaned.Add(int64(r.Cleaned))
				})
				wg.Go(func() {
					<-start
					r, err := b.svc.DeleteWorker(b.ctx, b.alice, w)
					if err != nil && !joblib.IsCode(err, joblib.CodeWorkerNotFound) {
						errs <- err
						return
					}
					errs <- nil
					cleaned.Add(int64(r.Cleaned))
				})
			}
			close(start)
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
			}
			if got := cleaned.Load(); got != perRound {
				t.Fatalf("round %d: %d cleanups reported for %d workers", round, got, perRound)
			}
			for _, w := range ws {
				if b.workerExists(w) {
					t.Fatalf("round %d: worker %s survived", round, w)
				}
				if es := b.events(w); len(es) != 1 {
					t.Fatalf("round %d: worker %s has %d audit rows, want 1", round, w, len(es))
				}
			}
			status := statusEvents(b.rec.take())
			for _, id := range failTasks {
				tk := b.task(id)
				if tk.Status != models.StatusFailed || tk.Error == nil || *tk.Error != joblib.ErrWorkerDisconnected || tk.LostWorkerID == nil {
					t.Fatalf("round %d: fail-policy task %s ended %s (error %v, lost %v)", round, id, tk.Status, tk.Error, tk.LostWorkerID)
				}
				if evs := status[id.String()]; len(evs) != 1 || evs[0].Status != models.StatusFailed {
					t.Fatalf("round %d: task %s got status events %+v, want one failed", round, id, evs)
				}
			}
			for _, id := range requeueTasks {
				tk := b.task(id)
				if tk.Status != models.StatusPending || tk.WorkerID != nil || tk.Attempt != 1 || tk.LostWorkerID == nil {
					t.Fatalf("round %d: requeue-policy task %s ended %s worker %v attempt %d", round, id, tk.Status, tk.WorkerID, tk.Attempt)
				}
				if evs := status[id.String()]; len(evs) != 1 || evs[0].Status != models.StatusPending {
					t.Fatalf("round %d: task %s got status events %+v, want one pending", round, id, evs)
				}
			}
			fj, err := db.Q(b.ctx).JobByKey("r", "modifiers", failJob.name)
			b.must(err)
			rj, err := db.Q(b.ctx).JobByKey("r", "modifiers", requeueJob.name)
			b.must(err)
			if !fj.Deleted || rj.Deleted {
				t.Fatalf("round %d: fail job deleted=%v (want true: no worker, no pending task), requeue job deleted=%v (want false: pending tasks)",
					round, fj.Deleted, rj.Deleted)
			}
		}
	})
}

// A claim racing the cleanup of its worker never leaves a task claimed by a
// worker that no longer exists: either the claim answers 404, or the
// cleanup sees and fails the task it claimed.
func TestClaimRacingCleanupLeavesNoZombie(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b := setup(t, db)
		for round := range 40 {
			j := jobSpec{name: "j" + uuid.NewString()[:8]}
			w := b.worker(j)
			ids := []uuid.UUID{b.submit(j), b.submit(j), b.submit(j)}
			start := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				<-start
				for range 3 {
					if _, err := b.svc.ClaimTask(b.ctx, b.alice, w); err != nil {
						if !joblib.IsCode(err, joblib.CodeWorkerNotFound) {
							t.Errorf("claim: %v", err)
						}
						return
					}
				}
			})
			wg.Go(func() {
				<-start
				if _, err := b.svc.CleanupWorker(b.ctx, w, joblib.CleanupParams{Path: joblib.PathGraceful}); err != nil {
					t.Errorf("cleanup: %v", err)
				}
			})
			close(start)
			wg.Wait()
			for _, id := range ids {
				tk := b.task(id)
				switch tk.Status {
				case models.StatusPending, models.StatusFailed:
				default:
					t.Fatalf("round %d: task %s is %s by worker %v after its worker was cleaned", round, id, tk.Status, tk.WorkerID)
				}
			}
		}
	})
}

func TestSweepJudgesByDatabaseClockAndPolicy(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b := setup(t, db)
		timeout := time.Minute
		failJob := jobSpec{name: "f", policy: joblib.OnWorkerLossFail}
		reqJob := jobSpec{name: "q", policy: joblib.OnWorkerLossRequeue, attempts: 2}
		stale, alive := b.worker(failJob, reqJob), b.worker(failJob, reqJob)
		tf, tq := b.submit(failJob), b.submit(reqJob)
		b.claim(stale)
		b.claim(stale)
		pending := b.submit(failJob)
		// Just under the threshold is alive; just over is stale.
		b.age([]uuid.UUID{alive}, timeout-5*time.Second)
		b.age([]uuid.UUID{stale}, timeout+time.Second)
		b.rec.take()

		rep, err := b.svc.Sweep(b.ctx, joblib.SweepParams{Threshold: timeout})
		b.must(err)
		if rep.Result.Cleaned != 1 || rep.Result.Workers[0].ID != stale || rep.Result.TasksFailed != 1 || rep.Result.TasksRequeued != 1 {
			t.Fatalf("sweep cleaned %+v", rep.Result)
		}
		if !b.workerExists(alive) || b.workerExists(stale) {
			t.Fatal("wrong worker cleaned")
		}
		if tk := b.task(tf); tk.Status != models.StatusFailed || *tk.Error != "Worker disconnected" || !tk.CompletedAt.Valid() {
			t.Fatalf("fail-policy task: %+v", tk)
		}
		if tk := b.task(tq); tk.Status != models.StatusPending || tk.Attempt != 1 {
			t.Fatalf("requeue-policy task: %+v", tk)
		}
		if tk := b.task(pending); tk.Status != models.StatusPending || tk.Error != nil {
			t.Fatalf("pending task touched: %+v", tk)
		}
		es := b.events(stale)
		if len(es) != 1 || es[0].Path != joblib.PathSweeper || es[0].SweepID == nil || *es[0].SweepID != rep.SweepID ||
			es[0].ThresholdMs == nil || *es[0].ThresholdMs != timeout.Milliseconds() || es[0].TasksFailed != 1 || es[0].TasksRequeued != 1 {
			t.Fatalf("audit rows %+v", es)
		}
		if age := es[0].DBNow.Sub(es[0].LastHeartbeat.Time); age < timeout || age > timeout+time.Minute {
			t.Fatalf("audit evidence: db_now - last_heartbeat = %s", age)
		}
		evs := statusEvents(b.rec.take())
		if len(evs[tf.String()]) != 1 || len(evs[tq.String()]) != 1 || len(evs) != 2 {
			t.Fatalf("status events %+v", evs)
		}

		// The requeued task is claimed again (attempt 2 = max_attempts) and
		// lost again: now it fails.
		w2 := b.worker(reqJob)
		if got := b.claim(w2); got != tq {
			t.Fatalf("claimed %s, want the requeued %s", got, tq)
		}
		b.age([]uuid.UUID{w2}, 2*timeout)
		_, err = b.svc.Sweep(b.ctx, joblib.SweepParams{Threshold: timeout})
		b.must(err)
		if tk := b.task(tq); tk.Status != models.StatusFailed || tk.Attempt != 2 || *tk.LostWorkerID != w2 {
			t.Fatalf("exhausted requeue task: status %s attempt %d lost %v", tk.Status, tk.Attempt, tk.LostWorkerID)
		}
	})
}

func TestSweepFailsStuckInternalTasksOnly(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b := setup(t, db, func(s *joblib.Settings) { s.InternalTaskTimeout = 50 * time.Millisecond })
		// An internal task as the server leaves it after dispatch: claimed, no worker.
		q := db.Q(b.ctx)
		b.must(q.UpsertJobAlways(models.Job{ID: uuid.New(), RoomID: "@internal", Category: "modifiers", Name: "slow", Schema: "{}", OnWorkerLoss: "fail", MaxAttempts: 1}))
		ij, err := q.JobByKey("@internal", "modifiers", "slow")
		b.must(err)
		internal, err := q.InsertTask(uuid.New(), ij.ID, "r", &b.alice.ID, "{}", models.StatusClaimed)
		b.must(err)
		ext := jobSpec{name: "ext"}
		w := b.worker(ext)
		b.submit(ext)
		extTask := b.claim(w)
		time.Sleep(100 * time.Millisecond)
		rep, err := b.svc.Sweep(b.ctx, joblib.SweepParams{Threshold: time.Hour})
		b.must(err)
		if len(rep.StuckInternal) != 1 || rep.StuckInternal[0].ID != internal.ID {
			t.Fatalf("stuck internal %+v", rep.StuckInternal)
		}
		if tk := b.task(internal.ID); tk.Status != models.StatusFailed || *tk.Error != "Internal worker timeout" {
			t.Fatalf("internal task %+v", tk)
		}
		if tk := b.task(extTask); tk.Status != models.StatusClaimed {
			t.Fatalf("external task touched: %s", tk.Status)
		}
	})
}

func TestSweepDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b := setup(t, db, func(s *joblib.Settings) { s.SweepBatchSize = 2 })
		j := jobSpec{name: "j"}
		var stale []uuid.UUID
		for range 5 {
			w := b.worker(j)
			b.submit(j)
			b.claim(w)
			stale = append(stale, w)
		}
		alive := b.worker(j)
		b.age(stale, 2*time.Minute)
		b.rec.take()
		rep, err := b.svc.Sweep(b.ctx, joblib.SweepParams{Threshold: time.Minute, DryRun: true})
		b.must(err)
		if rep.Result.Cleaned != 5 || rep.Result.TasksFailed != 5 {
			t.Fatalf("plan over batches of 2: %d workers, %d tasks; want 5, 5", rep.Result.Cleaned, rep.Result.TasksFailed)
		}
		for _, w := range append(stale, alive) {
			if !b.workerExists(w) || len(b.events(w)) != 0 {
				t.Fatalf("dry run changed worker %s", w)
			}
		}
		if ems := b.rec.take(); len(ems) != 0 {
			t.Fatalf("dry run published %d events", len(ems))
		}
		rep, err = b.svc.Sweep(b.ctx, joblib.SweepParams{Threshold: time.Minute, Path: joblib.PathOperator})
		b.must(err)
		if rep.Result.Cleaned != 5 || !b.workerExists(alive) {
			t.Fatalf("fix cleaned %d", rep.Result.Cleaned)
		}
		for _, w := range stale {
			if es := b.events(w); len(es) != 1 || es[0].Path != joblib.PathOperator {
				t.Fatalf("audit of %s: %+v", w, es)
			}
		}
	})
}

func TestSweepCapRecordsPlanInsteadOfActing(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b := setup(t, db, func(s *joblib.Settings) { s.SweepMaxFraction = 0.5; s.SweepCapMinWorkers = 2 })
		j := jobSpec{name: "j"}
		var ws []uuid.UUID
		for range 4 {
			ws = append(ws, b.worker(j))
		}
		b.age(ws[:3], 2*time.Minute) // 3 of 4 stale: over 50 % and over 2
		rep, err := b.svc.Sweep(b.ctx, joblib.SweepParams{Threshold: time.Minute, Cap: true, RecordShadow: true})
		b.must(err)
		if !rep.Capped || rep.StaleWorkers != 3 || rep.TotalWorkers != 4 || rep.Result.Cleaned != 3 {
			t.Fatalf("report %+v", rep)
		}
		for _, w := range ws[:3] {
			es := b.events(w)
			if !b.workerExists(w) || len(es) != 1 || !es[0].Shadow {
				t.Fatalf("capped sweep acted on %s or recorded %+v", w, es)
			}
		}
		// At or under the cap the sweep acts.
		b.age(ws[:2], time.Second)
		rep, err = b.svc.Sweep(b.ctx, joblib.SweepParams{Threshold: time.Minute, Cap: true, RecordShadow: true})
		b.must(err)
		if rep.Capped || rep.Result.Cleaned != 1 || b.workerExists(ws[2]) {
			t.Fatalf("sweep under the cap: %+v", rep)
		}
	})
}

func TestRecoverNodeCleansOnlyPreviousRunsOfThisNode(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b := setup(t, db)
		j := jobSpec{name: "j"}
		prevRun, otherNode, thisRun, reattached, restOnly := b.worker(j), b.worker(j), b.worker(j), b.worker(j), b.worker(j)
		b.submit(j)
		task := b.claim(prevRun)
		q := db.Q(b.ctx)
		_, err := q.BindWorker(prevRun, "node-a", "old-run")
		b.must(err)
		_, err = q.BindWorker(otherNode, "node-b", "old-run")
		b.must(err)
		_, err = q.BindWorker(reattached, "node-a", "old-run")
		b.must(err)
		_, err = q.BindWorker(reattached, "node-b", "run-b") // re-attached elsewhere since
		b.must(err)
		_, err = b.svc.BindWorker(b.ctx, thisRun)
		b.must(err)

		res, err := b.svc.RecoverNode(b.ctx)
		b.must(err)
		if res.Cleaned != 1 || res.Workers[0].ID != prevRun {
			t.Fatalf("recovered %+v", res.Workers)
		}
		for _, w := range []uuid.UUID{otherNode, thisRun, reattached, restOnly} {
			if !b.workerExists(w) {
				t.Fatalf("worker %s cleaned", w)
			}
		}
		if es := b.events(prevRun); len(es) != 1 || es[0].Path != joblib.PathStartup {
			t.Fatalf("audit %+v", es)
		}
		if tk := b.task(task); tk.Status != models.StatusFailed {
			t.Fatalf("task of recovered worker is %s", tk.Status)
		}
	})
}

func TestRetryTaskIsAudited(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b := setup(t, db)
		j := jobSpec{name: "j"}
		w, keep := b.worker(j), b.worker(j)
		id := b.submit(j)
		b.claim(w)
		_, err := b.svc.CleanupWorker(b.ctx, w, joblib.CleanupParams{Path: joblib.PathOperator})
		b.must(err)
		b.rec.take()
		tk, err := b.svc.RetryTask(b.ctx, id, "cli:ops")
		b.must(err)
		if tk.Status != models.StatusPending || tk.Error != nil || tk.WorkerID != nil || tk.Attempt != 1 {
			t.Fatalf("retried task %+v", tk)
		}
		al, err := db.Q(b.ctx).ListAudit(id)
		b.must(err)
		if len(al) != 1 || al[0].Action != joblib.AuditTaskRetry || al[0].Actor != "cli:ops" {
			t.Fatalf("audit log %+v", al)
		}
		ems := b.rec.take()
		var avail int
		for _, e := range ems {
			if _, ok := e.Event.(events.TaskAvailable); ok {
				avail++
			}
		}
		if len(statusEvents(ems)[id.String()]) != 1 || avail != 1 {
			t.Fatalf("events %+v", ems)
		}
		if _, err := b.svc.RetryTask(b.ctx, id, "cli:ops"); !joblib.IsCode(err, joblib.CodeInvalidTaskTransition) {
			t.Fatalf("retry of a pending task: %v", err)
		}
		if got := b.claim(keep); got != id {
			t.Fatalf("claimed %s", got)
		}
	})
}
