package joblib

import (
	"context"
	"encoding/json"
)

// InternalJob is a job type executed inside the server (room @internal).
type InternalJob struct {
	Category string
	Name     string
	Schema   json.RawMessage
	// Handler runs one task; returning an error fails the task with its text.
	Handler func(ctx context.Context, t InternalTask) error
}

// FullName is @internal:category:name.
func (j InternalJob) FullName() string { return RoomInternal + ":" + j.Category + ":" + j.Name }

// InternalTask is what an internal handler receives.
type InternalTask struct {
	ID      string
	RoomID  string
	Payload json.RawMessage
}

type internalRunner struct{}

func (s *Service) internalJob(fullName string) (InternalJob, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	j, ok := s.internal[fullName]
	return j, ok
}

func (s *Service) dispatchInternal(ctx context.Context, j InternalJob, t Task) {}
