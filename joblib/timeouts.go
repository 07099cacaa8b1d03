package joblib

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/models"
)

// AuditTaskTimeout is the audit action of a task the sweeper timed out; its
// detail is the evidence (limit, seconds, claimed_at, progress_at,
// deadline_at, db_now, worker_id, outcome).
const AuditTaskTimeout = "task_timeout"

// TimedOutTask is a task the sweeper timed out, with its evidence.
type TimedOutTask struct {
	Task
	// HeldBy is the worker that held it; Limit ("task_timeout" or
	// "heartbeat_timeout") and Seconds the limit it passed.
	HeldBy  uuid.UUID
	Limit   string
	Seconds int
}

// TimeOutTasks fails, or requeues per job policy (on_timeout), every
// claimed or running task past its deadline by the database's clock, in
// batches of Settings.SweepBatchSize (one transaction of a constant number
// of statements each). Each batch's events go out after its commit: the
// task's status event to its room, task_available to the job's workers for
// a requeued one, and task_cancelled with the reason to the socket of the
// worker that held it, on whichever node that is. A task is timed out once
// whichever node sweeps it (row locks and a status re-check). It is the
// sweeper's duty; callers apply the sweeper's outage guard first.
func (s *Service) TimeOutTasks(ctx context.Context, sweepID *uuid.UUID, fence LeaderFence) ([]TimedOutTask, error) {
	all, err := leaderBatches(ctx, s, func(q *models.Q, em *events.Set, batch int) ([]TimedOutTask, error) {
		ts, err := q.TimeOutTasks(batch, AuditTaskTimeout, "sweeper", sweepID, fence)
		if err != nil {
			return nil, err
		}
		out := make([]TimedOutTask, 0, len(ts))
		for _, t := range ts {
			v := TimedOutTask{Task: taskView(t.Task), HeldBy: t.HeldBy, Limit: t.Limit, Seconds: t.Seconds}
			out = append(out, v)
			for _, pe := range s.progress.take(t.ID) { // its last progress goes before its end
				em.Add(pe.Room, pe.Event)
			}
			addTaskChanged(em, v.Task)
			if t.HeldBy != uuid.Nil {
				em.Add(events.WorkerRoom(t.HeldBy.String()), events.TaskCancelled{TaskID: v.ID.String(), Reason: timeoutReason(v)})
			}
		}
		return out, nil
	})
	if len(all) > 0 {
		s.log.Warn("stuck tasks timed out", "tasks", len(all))
	}
	return all, err
}

// timeoutReason is what task_cancelled tells the holder of a timed-out task.
func timeoutReason(t TimedOutTask) string {
	if t.Status == models.StatusFailed && t.Error != nil {
		return *t.Error
	}
	return fmt.Sprintf("Task timed out: %s of %ds passed; requeued", t.Limit, t.Seconds)
}
