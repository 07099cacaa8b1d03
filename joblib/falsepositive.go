package joblib

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// FalsePositive is a worker that a cleanup removed (other than by a graceful
// delete) and whose owner was heard from again for it: a late heartbeat or
// a late status update of a task it had lost. The owner is answered 404
// worker-not-found, so that the client re-registers.
type FalsePositive struct {
	WorkerID uuid.UUID
	UserID   uuid.UUID
	// Path is the cleanup path that removed it.
	Path    string
	SweepID *uuid.UUID
	// Via is how it was heard from: "heartbeat" or "task_update".
	Via string
	// LastHeartbeat and CleanedAt are the evidence of the cleanup (database
	// clock); HeardAt is when it was heard from again.
	LastHeartbeat, CleanedAt, HeardAt time.Time
}

// Ways a reaped worker is heard from again.
const (
	HeardViaHeartbeat  = "heartbeat"
	HeardViaTaskUpdate = "task_update"
)

// OnFalsePositive registers an observer for false positives; each reaped
// worker is reported at most once.
func (s *Service) OnFalsePositive(fn func(FalsePositive)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fpObservers = append(s.fpObservers, fn)
}

// noteHeard records that the owner of a reaped worker was heard from again.
// The caller's answer (404) does not depend on it, so a failure to record is
// logged for the operator rather than returned.
func (s *Service) noteHeard(ctx context.Context, userID, workerID uuid.UUID, via string) {
	r, first, err := s.db.Q(context.WithoutCancel(ctx)).MarkWorkerHeard(workerID, userID, via)
	if err != nil {
		s.log.Error("record false positive", "worker_id", workerID, "err", err)
		return
	}
	if !first {
		return
	}
	fp := FalsePositive{WorkerID: workerID, UserID: userID, Path: r.Path, SweepID: r.SweepID, Via: via,
		LastHeartbeat: r.LastHeartbeat.Time, CleanedAt: r.DBNow.Time, HeardAt: r.HeardAt.Time}
	s.log.Warn("false positive: reaped worker heard from again", "worker_id", workerID, "path", fp.Path, "via", via,
		"last_heartbeat", fp.LastHeartbeat, "cleaned_at", fp.CleanedAt, "heard_at", fp.HeardAt)
	s.mu.RLock()
	obs := s.fpObservers
	s.mu.RUnlock()
	for _, o := range obs {
		o(fp)
	}
}
