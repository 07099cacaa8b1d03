package joblib

import (
	"context"
	"time"

	"github.com/zndraw/joblib/models"
)

// taskPruneMaxBatches bounds one retention pass: at most this many batches
// per status, so a large backlog (retention just switched on, or shortened)
// is worked off over several sweeper intervals instead of in one long run.
const taskPruneMaxBatches = 100

// PruneReport is what one retention pass did (or, dry, would do).
type PruneReport struct {
	// Deleted counts the tasks deleted (dry run: that would be) per status.
	Deleted map[string]int64
	// Batches is the number of delete statements run.
	Batches int
	// More is true when a status still had tasks to delete when the pass
	// stopped at its batch bound; the next pass goes on.
	More bool
	Took time.Duration
}

// Total is the number of tasks deleted.
func (r PruneReport) Total() int64 {
	var n int64
	for _, v := range r.Deleted {
		n += v
	}
	return n
}

// taskRetention lists each terminal status with its retention (0 keeps).
func (st Settings) taskRetention() []struct {
	status string
	keep   time.Duration
} {
	return []struct {
		status string
		keep   time.Duration
	}{
		{models.StatusCompleted, st.TaskRetentionCompleted},
		{models.StatusCancelled, st.TaskRetentionCompleted},
		{models.StatusFailed, st.TaskRetentionFailed},
	}
}

// PruneTasks deletes finished tasks past their retention
// (Settings.TaskRetentionCompleted for completed and cancelled,
// Settings.TaskRetentionFailed for failed; 0 keeps them), judged by the
// database's clock from completed_at, in batches of
// Settings.TaskRetentionBatch, each its own short transaction. Pending,
// claimed and running tasks are never deleted. A removed task answers 404
// like an unknown one; no long-poll waits on it, since a long-poll only
// waits while its task is not terminal. With dryRun it only counts. It is
// the operator's command (unfenced); the sweeper's retention step is fenced
// by its leadership.
func (s *Service) PruneTasks(ctx context.Context, dryRun bool) (PruneReport, error) {
	return s.prune(ctx, dryRun, LeaderFence{})
}

func (s *Service) prune(ctx context.Context, dryRun bool, lead LeaderFence) (PruneReport, error) {
	start := time.Now()
	st := s.Settings()
	rep := PruneReport{Deleted: map[string]int64{}}
	q := s.db.Q(ctx)
	for _, r := range st.taskRetention() {
		if r.keep <= 0 {
			continue
		}
		if dryRun {
			n, err := q.CountPrunableTasks(r.status, r.keep)
			if err != nil {
				return rep, err
			}
			rep.Deleted[r.status] = n
			continue
		}
		for i := 0; ; i++ {
			if i == taskPruneMaxBatches {
				rep.More = true
				break
			}
			n, err := q.PruneTasks(r.status, r.keep, st.TaskRetentionBatch, lead)
			rep.Batches++
			if n > 0 {
				rep.Deleted[r.status] += n
				s.notePruned(r.status, n)
			}
			if err != nil {
				rep.Took = time.Since(start)
				return rep, err
			}
			if n < int64(st.TaskRetentionBatch) {
				break
			}
		}
	}
	rep.Took = time.Since(start)
	return rep, nil
}

// OnTasksPruned registers an observer of deleted tasks (metrics): it gets
// the status and count of every retention batch that deleted some.
func (s *Service) OnTasksPruned(fn func(status string, n int64)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pruneObs = append(s.pruneObs, fn)
}

func (s *Service) notePruned(status string, n int64) {
	s.mu.RLock()
	obs := s.pruneObs
	s.mu.RUnlock()
	for _, o := range obs {
		o(status, n)
	}
}

// pruneTasks is the sweeper's retention step: on the leader, at most once a
// sweeper interval, after the stale-worker sweep. Failures are logged and
// retried next time; they never hold the sweep back.
func (sw *Sweeper) pruneTasks(ctx context.Context) {
	st := sw.svc.Settings()
	if n, more, err := sw.svc.PruneIdempotencyKeys(ctx); err != nil {
		if ctx.Err() == nil {
			sw.log.Error("idempotency key retention failed; retrying next interval", "err", err, "deleted", n)
		}
	} else if n > 0 {
		sw.log.Info("idempotency keys past their window deleted", "keys", n, "more", more)
	}
	if st.TaskRetentionCompleted <= 0 && st.TaskRetentionFailed <= 0 {
		return
	}
	rep, err := sw.svc.prune(ctx, false, sw.fence)
	if err != nil {
		if ctx.Err() == nil {
			sw.log.Error("task retention failed; retrying next interval", "err", err, "deleted", rep.Total())
		}
		return
	}
	if n := rep.Total(); n > 0 {
		sw.log.Info("finished tasks past retention deleted", "tasks", n, "by_status", rep.Deleted,
			"batches", rep.Batches, "more", rep.More, "took", rep.Took)
	}
}

// PruneIdempotencyKeys deletes the submissions' idempotency keys older than
// Settings.IdempotencyWindow (database clock) in batches of
// Settings.TaskRetentionBatch, each its own statement, at most
// taskPruneMaxBatches of them; more is true when keys were left for the
// next pass.
func (s *Service) PruneIdempotencyKeys(ctx context.Context) (deleted int64, more bool, err error) {
	st := s.Settings()
	q := s.db.Q(ctx)
	for range taskPruneMaxBatches {
		n, err := q.PruneIdempotencyKeys(st.IdempotencyWindow, st.TaskRetentionBatch)
		deleted += n
		if err != nil || n < int64(st.TaskRetentionBatch) {
			return deleted, false, err
		}
	}
	return deleted, true, nil
}
