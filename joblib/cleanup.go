package joblib

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/models"
)

// Cleanup paths: who decided that a worker is gone. Recorded in the audit
// trail and in metrics.
const (
	PathGraceful   = "graceful"   // DELETE /workers/{id}
	PathDisconnect = "disconnect" // its socket closed and did not come back in the grace window
	PathSweeper    = "sweeper"    // its heartbeat is older than the worker timeout
	PathStartup    = "startup"    // its socket was held by a previous run of this node
	PathOperator   = "operator"   // joblib sweep --fix
)

// ErrWorkerDisconnected is the error recorded on tasks failed by a cleanup.
const ErrWorkerDisconnected = "Worker disconnected"

// CleanupParams say why a cleanup runs and under which condition.
type CleanupParams struct {
	Path string
	// Fence is re-checked under the worker's row lock; a worker for which it
	// no longer holds is left alone (it heartbeated, reconnected, or another
	// path cleaned it first).
	Fence   models.CleanupFence
	SweepID *uuid.UUID
}

// CleanupResult is what a cleanup did.
type CleanupResult struct {
	// Cleaned is the number of workers removed (0 when the fence did not hold
	// or the worker was already gone).
	Cleaned       int
	TasksFailed   int
	TasksRequeued int
	OrphanJobs    int
	// FrameRooms are the rooms that lost a provider of category "frames".
	FrameRooms []string
	// Workers are the removed workers with their evidence.
	Workers []models.CleanedWorker
}

// CleanupObserver is told about every cleanup that removed something, after
// commit (metrics, logs).
type CleanupObserver func(path string, r CleanupResult)

// CleanupWorker is the one cascade every path converges on: it fails (or
// requeues, per job policy) the worker's claimed and running tasks, removes
// its providers and links, deletes it, soft-deletes the jobs left orphaned,
// writes the audit trail, and publishes the events once, after commit. Two
// callers racing on one worker produce exactly one cleanup.
func (s *Service) CleanupWorker(ctx context.Context, id uuid.UUID, p CleanupParams) (CleanupResult, error) {
	return s.CleanupWorkers(ctx, []uuid.UUID{id}, p)
}

// CleanupWorkers is CleanupWorker for many workers in one transaction with a
// constant number of statements.
func (s *Service) CleanupWorkers(ctx context.Context, ids []uuid.UUID, p CleanupParams) (CleanupResult, error) {
	var res CleanupResult
	if len(ids) == 0 {
		return res, nil
	}
	start := time.Now()
	err := s.mutate(ctx, func(q *models.Q, em *events.Set) error {
		out, err := q.CleanupWorkers(ids, p.Fence, ErrWorkerDisconnected, models.CleanupAudit{Path: p.Path, SweepID: p.SweepID})
		if err != nil {
			return err
		}
		res = CleanupResult{Cleaned: len(out.Workers), OrphanJobs: len(out.OrphanJobs), Workers: out.Workers}
		cleanupEmissions(out, em)
		for _, w := range out.Workers {
			res.TasksFailed += w.TasksFailed
			res.TasksRequeued += w.TasksRequeued
			for _, r := range w.FrameRooms {
				res.FrameRooms = appendUniqueStr(res.FrameRooms, r)
			}
		}
		return nil
	})
	if err != nil {
		return CleanupResult{}, err
	}
	if res.Cleaned > 0 {
		s.log.Info("workers cleaned up", "path", p.Path, "workers", res.Cleaned, "tasks_failed", res.TasksFailed,
			"tasks_requeued", res.TasksRequeued, "orphan_jobs", res.OrphanJobs, "took", time.Since(start))
		s.mu.RLock()
		obs := s.observers
		s.mu.RUnlock()
		for _, o := range obs {
			o(p.Path, res)
		}
	}
	return res, nil
}

// OnCleanup registers an observer for completed cleanups.
func (s *Service) OnCleanup(o CleanupObserver) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.observers = append(s.observers, o)
}

// cleanupEmissions builds the events of contract §6.2 for a cleanup.
func cleanupEmissions(out models.CleanupOutcome, em *events.Set) {
	for _, t := range out.Tasks {
		v := taskView(t)
		em.Add(events.Room(v.RoomID), statusEvent(v))
		if v.Status == models.StatusPending && v.JobName != "" {
			em.Add(events.JobRoom(v.JobName), events.TaskAvailable{JobName: v.JobName, RoomID: v.RoomID, TaskID: v.ID.String()})
		}
	}
	for _, w := range out.Workers {
		for _, r := range w.LinkedJobRooms {
			em.Add(events.Room(r), events.JobsInvalidate{})
		}
		for _, r := range w.ProviderRooms {
			em.Add(events.Room(r), events.ProvidersInvalidate{})
		}
	}
	for _, j := range out.OrphanJobs {
		em.Add(events.Room(j.RoomID), events.JobsInvalidate{})
	}
}

func appendUniqueStr(s []string, v string) []string {
	for _, x := range s {
		if x == v {
			return s
		}
	}
	return append(s, v)
}
