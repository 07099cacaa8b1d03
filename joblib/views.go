package joblib

import (
	"cmp"
	"encoding/json"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/taskstatus"
	"github.com/zndraw/joblib/models"
)

// Page is one page of a listing, as the API returns it.
type Page[T any] struct {
	Items  []T   `json:"items"`
	Total  int64 `json:"total"`
	Limit  int   `json:"limit"`
	Offset int   `json:"offset"`
}

// PageParams are validated limit/offset values.
type PageParams = models.Page

// Principal is the authenticated caller.
type Principal struct {
	ID        uuid.UUID
	Name      string
	Superuser bool
}

// Worker is a worker as POST/PATCH /workers return it.
type Worker struct {
	ID            uuid.UUID   `json:"id"`
	LastHeartbeat events.Time `json:"last_heartbeat"`
}

// WorkerSummary is a worker in listings.
type WorkerSummary struct {
	ID            uuid.UUID   `json:"id"`
	LastHeartbeat events.Time `json:"last_heartbeat"`
	JobCount      int64       `json:"job_count"`
}

// Job is a job's detail view.
type Job struct {
	ID           uuid.UUID       `json:"id"`
	RoomID       string          `json:"room_id"`
	Category     string          `json:"category"`
	Name         string          `json:"name"`
	FullName     string          `json:"full_name"`
	Schema       json.RawMessage `json:"schema"`
	Workers      []uuid.UUID     `json:"workers"`
	WorkerID     *uuid.UUID      `json:"worker_id"`
	OnWorkerLoss string          `json:"on_worker_loss"`
	MaxAttempts  int             `json:"max_attempts"`
	// TaskTimeout and HeartbeatTimeout are the job's task limits in
	// seconds (null: none); OnTimeout is "fail" or "requeue".
	TaskTimeout      *int   `json:"task_timeout"`
	HeartbeatTimeout *int   `json:"heartbeat_timeout"`
	OnTimeout        string `json:"on_timeout"`
	// Retry is the job's retry policy (null: a failed report is final).
	Retry *RetryPolicy `json:"retry"`
}

// JobSummary is a job in listings.
type JobSummary struct {
	FullName string      `json:"full_name"`
	Category string      `json:"category"`
	Name     string      `json:"name"`
	Workers  []uuid.UUID `json:"workers"`
}

// Task is a task as the API returns it.
type Task struct {
	ID            uuid.UUID       `json:"id"`
	JobName       string          `json:"job_name"`
	RoomID        string          `json:"room_id"`
	Status        string          `json:"status"`
	CreatedAt     events.Time     `json:"created_at"`
	StartedAt     events.Time     `json:"started_at"`
	CompletedAt   events.Time     `json:"completed_at"`
	WorkerID      *uuid.UUID      `json:"worker_id"`
	Error         *string         `json:"error"`
	Payload       json.RawMessage `json:"payload"`
	QueuePosition *int64          `json:"queue_position"`
	Attempt       int             `json:"attempt"`
	// Result is what an @internal job returned, or what the worker reported
	// with the completion (PATCH {"status":"completed","result":...}); null
	// otherwise.
	Result json.RawMessage `json:"result"`
	// TaskTimeout and HeartbeatTimeout are the task's limits in seconds
	// (null: none); DeadlineAt is when it is stuck unless it reports
	// progress (heartbeat_timeout) or finishes first (null: not held, or no
	// limit).
	TaskTimeout      *int        `json:"task_timeout"`
	HeartbeatTimeout *int        `json:"heartbeat_timeout"`
	DeadlineAt       events.Time `json:"deadline_at"`
	// Progress is the last progress its worker reported (null: none), at
	// ProgressAt.
	Progress   *Progress   `json:"progress"`
	ProgressAt events.Time `json:"progress_at"`
	// Priority orders claims (-100..100, higher first); RunAt is when it
	// may be claimed from (null: at submission); Errors are its failed
	// attempts' errors, the last models.MaxAttemptErrors (absent: none).
	Priority int                   `json:"priority"`
	RunAt    events.Time           `json:"run_at"`
	Errors   []models.AttemptError `json:"errors,omitempty"`
}

// Progress is a task's reported progress. Every field is optional.
type Progress struct {
	Current *float64 `json:"current"`
	Total   *float64 `json:"total"`
	Message *string  `json:"message"`
}

// Terminal reports whether the task reached a final status.
func (t Task) Terminal() bool { return taskstatus.Terminal(t.Status) }

// Provider is a provider as the API returns it.
type Provider struct {
	ID       uuid.UUID       `json:"id"`
	RoomID   string          `json:"room_id"`
	Category string          `json:"category"`
	Name     string          `json:"name"`
	FullName string          `json:"full_name"`
	Schema   json.RawMessage `json:"schema"`
	// ContentType is the media type reads answer with (beyond the
	// contract's ProviderResponse, which has none).
	ContentType string      `json:"content_type"`
	WorkerID    uuid.UUID   `json:"worker_id"`
	CreatedAt   events.Time `json:"created_at"`
}

func wireTime(t models.Time) events.Time { return events.Time{Time: t.Time} }

func rawJSON(s string) json.RawMessage {
	if s == "" {
		return json.RawMessage("{}")
	}
	return json.RawMessage(s)
}

func workerView(w models.Worker) Worker {
	return Worker{ID: w.ID, LastHeartbeat: wireTime(w.LastHeartbeat)}
}

func workerSummary(w models.Worker) WorkerSummary {
	return WorkerSummary{ID: w.ID, LastHeartbeat: wireTime(w.LastHeartbeat), JobCount: w.JobCount}
}

func jobView(j models.Job, workers []uuid.UUID, workerID *uuid.UUID) Job {
	if workers == nil {
		workers = []uuid.UUID{}
	}
	return Job{
		ID: j.ID, RoomID: j.RoomID, Category: j.Category, Name: j.Name, FullName: j.FullName(),
		Schema: rawJSON(j.Schema), Workers: workers, WorkerID: workerID,
		OnWorkerLoss: j.OnWorkerLoss, MaxAttempts: j.MaxAttempts,
		TaskTimeout: j.TaskTimeout, HeartbeatTimeout: j.HeartbeatTimeout, OnTimeout: cmp.Or(j.OnTimeout, OnTimeoutFail),
		Retry: retryView(j),
	}
}

func taskView(t models.Task) Task {
	v := Task{
		ID: t.ID, JobName: t.JobFullName(), RoomID: t.RoomID, Status: t.Status,
		CreatedAt: wireTime(t.CreatedAt), StartedAt: wireTime(t.StartedAt), CompletedAt: wireTime(t.CompletedAt),
		WorkerID: t.WorkerID, Error: t.Error, Payload: rawJSON(t.Payload), QueuePosition: t.QueuePosition,
		Attempt: t.Attempt,
	}
	if t.Result != nil {
		v.Result = json.RawMessage(*t.Result)
	}
	v.TaskTimeout, v.HeartbeatTimeout = t.TaskTimeout, t.HeartbeatTimeout
	if t.Status == models.StatusClaimed || t.Status == models.StatusRunning {
		v.DeadlineAt = wireTime(t.DeadlineAt)
	}
	if t.ProgressAt.Valid() {
		v.Progress = &Progress{Current: t.ProgressCurrent, Total: t.ProgressTotal, Message: t.ProgressMessage}
		v.ProgressAt = wireTime(t.ProgressAt)
	}
	v.Priority, v.RunAt = t.Priority, wireTime(t.RunAt)
	if t.Errors != nil && *t.Errors != "" {
		_ = json.Unmarshal([]byte(*t.Errors), &v.Errors) // written by models as this list
	}
	return v
}

func providerView(p models.Provider) Provider {
	return Provider{
		ID: p.ID, RoomID: p.RoomID, Category: p.Category, Name: p.Name, FullName: p.FullName(),
		Schema: rawJSON(p.Schema), ContentType: p.ContentType, WorkerID: p.WorkerID, CreatedAt: wireTime(p.CreatedAt),
	}
}

// addTaskChanged adds a changed task's events: its status to its room and,
// when it is claimable again, task_available to its job's workers.
func addTaskChanged(em *events.Set, v Task) {
	em.Add(events.Room(v.RoomID), statusEvent(v))
	if v.Status == models.StatusPending && v.JobName != "" {
		em.Add(events.JobRoom(v.JobName), events.TaskAvailable{JobName: v.JobName, RoomID: v.RoomID, TaskID: v.ID.String()})
	}
}

// statusEvent is the task_status_event for a task's current state.
func statusEvent(t Task) events.TaskStatusEvent {
	var wid *string
	if t.WorkerID != nil {
		s := t.WorkerID.String()
		wid = &s
	}
	return events.TaskStatusEvent{
		ID: t.ID.String(), Name: t.JobName, RoomID: t.RoomID, Status: t.Status,
		CreatedAt: t.CreatedAt, StartedAt: t.StartedAt, CompletedAt: t.CompletedAt,
		QueuePosition: t.QueuePosition, WorkerID: wid, Error: t.Error,
	}
}
