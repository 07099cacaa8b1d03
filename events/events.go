package events

import (
	"bytes"
	"encoding/json"
	"time"
)

// Event is one server→client event. Its payload is the JSON encoding of the
// value, always a single object with every field present.
type Event interface {
	// EventName is the Socket.IO wire name (snake_case of the contract's class name).
	EventName() string
}

// Room names. Frontends of a room listen on Room(id); workers serving a job on
// JobRoom(fullName); clients serving a provider on ProviderRoom(fullName).
func Room(roomID string) string           { return "room:" + roomID }
func JobRoom(fullName string) string      { return "jobs:" + fullName }
func ProviderRoom(fullName string) string { return "providers:" + fullName }

// WorkerRoom is the room of one worker's socket (joined when the socket
// binds the worker): events meant for the worker holding a task.
func WorkerRoom(workerID string) string { return "worker:" + workerID }

// JobsInvalidate tells a room's UIs that its job list (or a job's workers) changed.
type JobsInvalidate struct{}

// TaskAvailable tells the workers of a job that a task was submitted.
type TaskAvailable struct {
	JobName string `json:"job_name"`
	RoomID  string `json:"room_id"`
	TaskID  string `json:"task_id"`
}

// TaskStatusEvent carries a task's new state to the room it was submitted to.
type TaskStatusEvent struct {
	ID            string  `json:"id"`
	Name          string  `json:"name"`
	RoomID        string  `json:"room_id"`
	Status        string  `json:"status"`
	CreatedAt     Time    `json:"created_at"`
	StartedAt     Time    `json:"started_at"`
	CompletedAt   Time    `json:"completed_at"`
	QueuePosition *int64  `json:"queue_position"`
	WorkerID      *string `json:"worker_id"`
	Error         *string `json:"error"`
}

// TaskCancelled tells the worker holding a task that the task ended
// without it: cancelled by its submitter or an operator, or timed out.
// Reason says which, in words.
type TaskCancelled struct {
	TaskID string `json:"task_id"`
	Reason string `json:"reason"`
}

// TaskProgressEvent carries a running task's last reported progress to the
// room it was submitted to (coalesced per task, see the joblib package).
type TaskProgressEvent struct {
	ID         string   `json:"id"`
	RoomID     string   `json:"room_id"`
	JobName    string   `json:"job_name"`
	Current    *float64 `json:"current"`
	Total      *float64 `json:"total"`
	Message    *string  `json:"message"`
	ProgressAt Time     `json:"progress_at"`
}

// ProvidersInvalidate tells a room's UIs that its provider list changed.
type ProvidersInvalidate struct{}

// TasksInvalidate tells a room's UIs that the task views they show may be
// stale: events between nodes were lost, so they should refetch. Sent only
// by the node that detected the loss, to its own sockets.
type TasksInvalidate struct{}

// ProviderRequest asks the clients serving a provider to produce a result.
type ProviderRequest struct {
	RequestID    string `json:"request_id"`
	ProviderName string `json:"provider_name"`
	Params       string `json:"params"`
}

// ProviderResultReady tells a room that a provider result was uploaded.
type ProviderResultReady struct {
	ProviderName string `json:"provider_name"`
	RequestHash  string `json:"request_hash"`
}

func (JobsInvalidate) EventName() string      { return "jobs_invalidate" }
func (TaskAvailable) EventName() string       { return "task_available" }
func (TaskStatusEvent) EventName() string     { return "task_status_event" }
func (ProvidersInvalidate) EventName() string { return "providers_invalidate" }
func (TasksInvalidate) EventName() string     { return "tasks_invalidate" }
func (ProviderRequest) EventName() string     { return "provider_request" }
func (ProviderResultReady) EventName() string { return "provider_result_ready" }
func (TaskCancelled) EventName() string       { return "task_cancelled" }
func (TaskProgressEvent) EventName() string   { return "task_progress_event" }

// Time is a timestamp on the wire: RFC 3339 in UTC with microseconds and a Z,
// or null for the zero value.
type Time struct{ time.Time }

// TimeLayout is the wire format of Time.
const TimeLayout = "2006-01-02T15:04:05.000000Z"

// MarshalJSON implements json.Marshaler.
func (t Time) MarshalJSON() ([]byte, error) {
	if t.IsZero() {
		return []byte("null"), nil
	}
	return []byte(`"` + t.UTC().Format(TimeLayout) + `"`), nil
}

// UnmarshalJSON implements json.Unmarshaler.
func (t *Time) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		t.Time = time.Time{}
		return nil
	}
	var s string
	if n := len(b); n >= 2 && b[0] == '"' && b[n-1] == '"' && bytes.IndexByte(b, '\\') < 0 {
		// A string without escapes is its bytes between the quotes:
		// every node decodes three of these per status event it hears,
		// and a nested json.Unmarshal each cost more than the rest of
		// the event.
		s = string(b[1 : n-1])
	} else if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	p, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return err
	}
	t.Time = p.UTC()
	return nil
}
