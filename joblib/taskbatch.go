package joblib

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/taskstatus"
	"github.com/zndraw/joblib/models"
)

// MaxUpdateBatch is the most status reports one batch update may carry.
const MaxUpdateBatch = 100

// TaskUpdate is one status report of a batch: what PATCH /tasks/{id} takes,
// with the task's id.
type TaskUpdate struct {
	TaskID uuid.UUID
	Status string
	Error  *string
	Result json.RawMessage
	// NoRetry makes a failed report final even when the job retries
	// ("retry": false).
	NoRetry bool
}

// TaskUpdateResult is the outcome of one report of a batch: the task as it
// is now, or why the report was refused (a *Error, as PATCH /tasks/{id}
// would have answered it).
type TaskUpdateResult struct {
	TaskID uuid.UUID
	Task   *Task
	Err    error
}

// UpdateTasks applies a batch of status reports (1..MaxUpdateBatch, each
// task at most once): each one as PATCH /tasks/{id} would, independently of
// the others, and the outcomes in the order of the reports. On PostgreSQL
// the reports of the caller's workers go in one statement; the rest, and
// every report on SQLite, take the general path one by one. The error is
// for the batch as a whole (its size, a repeated task); a report's own
// refusal is in its result.
func (s *Service) UpdateTasks(ctx context.Context, p Principal, ups []TaskUpdate) ([]TaskUpdateResult, error) {
	if len(ups) < 1 || len(ups) > MaxUpdateBatch {
		return nil, errf(CodeValidation, "a batch carries between 1 and %d updates", MaxUpdateBatch)
	}
	seen := make(map[uuid.UUID]bool, len(ups))
	for _, u := range ups {
		if seen[u.TaskID] {
			return nil, errf(CodeValidation, "task %s appears more than once in the batch", u.TaskID)
		}
		seen[u.TaskID] = true
	}
	out := make([]TaskUpdateResult, len(ups))
	stored := make([]*string, len(ups))
	var hot []models.HotUpdate
	for i, u := range ups {
		out[i].TaskID = u.TaskID
		st, err := s.checkUpdate(u.Status, u.Error, u.Result)
		if err != nil {
			out[i].Err = err
			continue
		}
		stored[i] = st
		if taskstatus.Terminal(u.Status) {
			s.progress.flush(u.TaskID) // its last progress goes before its end
		}
		if s.hotEligible(u.Status, u.Error) {
			hot = append(hot, toHotUpdate(p.ID, u.TaskID, u.Status, u.Error, st))
		}
	}
	done := map[uuid.UUID]Task{}
	if len(hot) > 0 {
		hts, err := s.db.UpdateTasksHot(ctx, hot, hotTransitions, s.hotNotify())
		if err != nil {
			return nil, err
		}
		for _, t := range s.publishHot(ctx, hts) {
			done[t.ID] = t
		}
	}
	for i, u := range ups {
		if out[i].Err != nil {
			continue
		}
		if t, ok := done[u.TaskID]; ok {
			out[i].Task = &t
			continue
		}
		t, err := s.updateTask(ctx, p, u.TaskID, u.Status, u.Error, stored[i], u.NoRetry)
		if err != nil {
			if _, ok := AsError(err); !ok {
				// Not a refusal but a failure (the database, the request's
				// deadline): this report's result carries it, the others
				// keep theirs.
				err = fmt.Errorf("update task %s: %w", u.TaskID, err)
			}
			out[i].Err = err
			continue
		}
		out[i].Task = &t
	}
	return out, nil
}
