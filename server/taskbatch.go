package server

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/joblib"
)

// taskUpdateBody is one report of a batch update, as PATCH /tasks/{id}
// takes it plus the task's id.
type taskUpdateBody struct {
	TaskID *uuid.UUID      `json:"task_id"`
	Status *string         `json:"status"`
	Error  *string         `json:"error"`
	Result json.RawMessage `json:"result"`
	// Retry false makes a failed report final, whatever the job's retry.
	Retry *bool `json:"retry"`
}

// taskUpdateItem is the answer to one report of a batch update: the task,
// or the problem PATCH /tasks/{id} would have answered.
type taskUpdateItem struct {
	TaskID  uuid.UUID    `json:"task_id"`
	Task    *joblib.Task `json:"task,omitempty"`
	Problem *Problem     `json:"problem,omitempty"`
}

// decodeTaskUpdates turns the "updates" member of a batch into the
// service's form; each report's members are matched exactly, as a request
// body's are.
func decodeTaskUpdates(updates json.RawMessage) ([]joblib.TaskUpdate, error) {
	var raw []json.RawMessage
	if err := json.Unmarshal(updates, &raw); err != nil || len(updates) == 0 || updates[0] != '[' {
		return nil, fmt.Errorf(`field "updates" must be an array of {task_id, status, error?, result?}`)
	}
	if len(raw) > joblib.MaxUpdateBatch {
		return nil, fmt.Errorf(`"updates" carries between 1 and %d updates`, joblib.MaxUpdateBatch) // before decoding them all
	}
	ups := make([]joblib.TaskUpdate, len(raw))
	for i, r := range raw {
		var b taskUpdateBody
		body, err := exactMembers(r, &b)
		if err == nil {
			err = json.Unmarshal(body, &b)
		}
		if err != nil {
			return nil, fmt.Errorf("updates[%d] must be an object {task_id, status, error?, result?}: %s", i, jsonProblem(err))
		}
		if b.TaskID == nil {
			return nil, fmt.Errorf(`updates[%d]: field "task_id" is required`, i)
		}
		ups[i] = joblib.TaskUpdate{TaskID: *b.TaskID, Error: b.Error, Result: b.Result, NoRetry: b.Retry != nil && !*b.Retry}
		if b.Status != nil {
			ups[i].Status = *b.Status
		}
	}
	return ups, nil
}

// taskUpdateItems turns the service's outcomes into the answer's items. A
// failure is answered as that report's problem, as REST answers the same
// error (classify).
func taskUpdateItems(ctx context.Context, log *slog.Logger, rs []joblib.TaskUpdateResult) []taskUpdateItem {
	out := make([]taskUpdateItem, len(rs))
	for i, r := range rs {
		out[i] = taskUpdateItem{TaskID: r.TaskID, Task: r.Task}
		if r.Err == nil {
			continue
		}
		v := classify(ctx, r.Err)
		if v.Log != "" {
			log.LogAttrs(ctx, v.LogLevel, "task update failed: "+v.Log, slog.String("task_id", r.TaskID.String()), slog.Any("err", r.Err))
		}
		out[i].Problem = &v.Problem
	}
	return out
}

// updateTasks is the batch update (beyond the contract): up to
// MaxUpdateBatch status reports in one request, each applied as PATCH
// /tasks/{id} would, answered as {"results": [...]} in the order of the
// reports.
func (s *Server) updateTasks(w http.ResponseWriter, r *http.Request) {
	p, ok := s.principal(w, r)
	if !ok {
		return
	}
	var b struct {
		Updates json.RawMessage `json:"updates"`
	}
	if !s.decodeBody(w, r, &b) {
		return
	}
	ups, err := decodeTaskUpdates(b.Updates)
	if err != nil {
		badRequest(w, err.Error())
		return
	}
	rs, err := s.svc.UpdateTasks(r.Context(), p, ups)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Results []taskUpdateItem `json:"results"`
	}{taskUpdateItems(r.Context(), s.log, rs)})
}
