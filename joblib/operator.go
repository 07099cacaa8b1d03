package joblib

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/models"
)

// AuditTaskRetry is the audit_log action of an operator retry.
const AuditTaskRetry = "task_retry"

// RetryTask puts a failed task back to pending (joblib tasks retry), keeps
// its attempt count, writes an audit_log row naming the actor and publishes
// the task's status event and task_available. The task's job must be live:
// a soft-deleted job has no worker to claim it (re-register it first).
func (s *Service) RetryTask(ctx context.Context, id uuid.UUID, actor string) (Task, error) {
	var out Task
	err := s.mutate(ctx, func(q *models.Q, em *events.Set) error {
		t, err := q.GetTask(id)
		if err != nil {
			return notFound(err, errf(CodeTaskNotFound, "Task '%s' not found", id))
		}
		if t.Status != models.StatusFailed {
			return errf(CodeInvalidTaskTransition, "Cannot retry a task in status '%s': only failed tasks are retried", t.Status)
		}
		if t.JobRoom == nil || t.JobCategory == nil || t.JobName == nil {
			return errf(CodeJobNotFound, "Job of task '%s' not found", id)
		}
		j, err := q.JobByKey(*t.JobRoom, *t.JobCategory, *t.JobName)
		if err != nil {
			return notFound(err, errf(CodeJobNotFound, "Job '%s' not found", t.JobFullName()))
		}
		if j.Deleted {
			return errf(CodeJobNotFound, "Job '%s' is deleted (no worker serves it); re-register it before retrying", j.FullName())
		}
		if j.RoomID == RoomInternal {
			return errf(CodeInvalidTaskTransition, "Internal tasks are not retried: submit a new one")
		}
		ok, err := q.RetryTask(id)
		if err != nil {
			return err
		}
		if !ok {
			return errf(CodeInvalidTaskTransition, "Task '%s' changed while retrying", id)
		}
		detail, err := json.Marshal(map[string]any{"from": t.Status, "error": t.Error, "attempt": t.Attempt, "lost_worker_id": t.LostWorkerID})
		if err != nil {
			return fmt.Errorf("encode retry audit: %w", err)
		}
		if err := q.InsertAudit(AuditTaskRetry, &id, actor, string(detail)); err != nil {
			return err
		}
		nt, err := q.GetTask(id)
		if err != nil {
			return err
		}
		out = taskView(nt)
		em.Add(events.Room(out.RoomID), statusEvent(out))
		em.Add(events.JobRoom(out.JobName), events.TaskAvailable{JobName: out.JobName, RoomID: out.RoomID, TaskID: out.ID.String()})
		return nil
	})
	return out, err
}
