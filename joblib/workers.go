package joblib

import (
	"context"
	"errors"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/models"
)

// CreateWorker registers a new worker for the caller.
// It answers 429 quota-exceeded past JOBLIB_USER_MAX_WORKERS.
func (s *Service) CreateWorker(ctx context.Context, p Principal) (Worker, error) {
	var w models.Worker
	err := s.db.Tx(ctx, func(q *models.Q) error {
		if err := s.checkQuota(q, p, models.UsageWorkers, false); err != nil {
			return err
		}
		var err error
		w, err = q.InsertWorker(p.ID)
		return err
	})
	if err != nil {
		return Worker{}, err
	}
	return workerView(w), nil
}

// Heartbeat proves a worker alive: its last heartbeat becomes the database's
// now. Only the owner may heartbeat (superusers included).
func (s *Service) Heartbeat(ctx context.Context, p Principal, id uuid.UUID) (Worker, error) {
	if s.db.Caps().HotPath {
		w, ok, err := s.db.HeartbeatHot(ctx, id, p.ID)
		if err != nil {
			return Worker{}, err
		}
		if ok {
			return workerView(w), nil
		}
	}
	var out models.Worker
	err := s.db.Tx(ctx, func(q *models.Q) error {
		w, err := q.GetWorker(id)
		if err != nil {
			return notFound(err, s.workerGone(id))
		}
		if w.UserID != p.ID {
			return errf(CodeForbidden, "Worker belongs to different user")
		}
		out, err = q.TouchWorker(id)
		return notFound(err, s.workerGone(id))
	})
	if err != nil {
		if IsCode(err, CodeWorkerNotFound) {
			// A reaped worker heard from again: recorded as a false positive
			// when the caller owned it; the answer is 404 either way.
			s.noteHeard(ctx, p.ID, id, HeardViaHeartbeat)
		}
		return Worker{}, err
	}
	return workerView(out), nil
}

// workerGone is the 404 for a worker that does not exist.
func (s *Service) workerGone(id uuid.UUID) *Error {
	return errf(CodeWorkerNotFound, "Worker '%s' not found", id)
}

// DeleteWorker is the graceful disconnect: the worker goes through
// CleanupWorker. Owner or superuser.
func (s *Service) DeleteWorker(ctx context.Context, p Principal, id uuid.UUID) (CleanupResult, error) {
	w, err := s.db.Q(ctx).GetWorker(id)
	if err != nil {
		return CleanupResult{}, notFound(err, s.workerGone(id))
	}
	if w.UserID != p.ID && !p.Superuser {
		return CleanupResult{}, errf(CodeForbidden, "Worker belongs to different user")
	}
	res, err := s.CleanupWorker(ctx, id, CleanupParams{Path: PathGraceful})
	if err != nil {
		return res, err
	}
	if res.Cleaned == 0 {
		// Someone else's cleanup won the race; to the caller it is gone.
		return res, s.workerGone(id)
	}
	if p.ID != w.UserID { // a superuser removed another user's worker
		err := s.db.Tx(ctx, func(q *models.Q) error {
			return audit(q, AuditWorkerDelete, &id, "user:"+p.Name, map[string]any{"user_id": p.ID, "owner_id": w.UserID,
				"tasks_failed": res.TasksFailed, "tasks_requeued": res.TasksRequeued})
		})
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

// ListWorkers pages through all workers, newest first.
func (s *Service) ListWorkers(ctx context.Context, pg PageParams) (Page[WorkerSummary], error) {
	ws, total, err := s.db.Q(ctx).ListWorkers(pg)
	if err != nil {
		return Page[WorkerSummary]{}, err
	}
	return summaries(ws, total, pg), nil
}

// ListRoomWorkers pages through the workers serving jobs visible from a room.
func (s *Service) ListRoomWorkers(ctx context.Context, room string, pg PageParams) (Page[WorkerSummary], error) {
	if err := ValidateRoomID(room); err != nil {
		return Page[WorkerSummary]{}, err
	}
	ws, total, err := s.db.Q(ctx).ListWorkersForJobRooms(jobRoomsVisibleFrom(room), pg)
	if err != nil {
		return Page[WorkerSummary]{}, err
	}
	return summaries(ws, total, pg), nil
}

func summaries(ws []models.Worker, total int64, pg PageParams) Page[WorkerSummary] {
	items := make([]WorkerSummary, len(ws))
	for i, w := range ws {
		items[i] = workerSummary(w)
	}
	return Page[WorkerSummary]{Items: items, Total: total, Limit: pg.Limit, Offset: pg.Offset}
}

// ownedWorker loads a worker that must exist and belong to the caller
// (superusers are not exempt: a worker is a process identity). The worker is
// locked until the transaction ends (models.LockWorker), so a cleanup of it
// waits and then sees what the transaction linked to it; taking this lock
// before any job lock keeps the worker → job lock order of CleanupWorker.
func ownedWorker(q *models.Q, p Principal, id uuid.UUID) (models.Worker, error) {
	w, err := q.LockWorker(id)
	if err == nil && w.UserID != p.ID {
		err = models.ErrNotFound
	}
	if errors.Is(err, models.ErrNotFound) {
		return w, errf(CodeWorkerNotFound, "Worker '%s' not found or not owned by user", id)
	}
	return w, err
}

// workerFor returns the worker a registration uses: the given one (which must
// be the caller's) or a new one.
func workerFor(q *models.Q, p Principal, id *uuid.UUID) (models.Worker, error) {
	if id != nil {
		return ownedWorker(q, p, *id)
	}
	return q.InsertWorker(p.ID)
}
