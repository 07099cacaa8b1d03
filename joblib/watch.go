package joblib

import (
	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/keywait"
)

// taskWatch wakes task long-polls on the task's change. It listens to the
// bus, so a change committed on another node (delivered by a multi-node bus)
// wakes a waiter here as well. Subscribe before reading the task so that no
// change can slip between the read and the wait.
type taskWatch struct {
	*keywait.Registry[uuid.UUID]
}

func newTaskWatch() taskWatch { return taskWatch{keywait.New[uuid.UUID]()} }

// observe is the bus subscriber: a task_status_event wakes that task's waiters.
func (w taskWatch) observe(e events.Emission) {
	ev, ok := e.Event.(events.TaskStatusEvent)
	if !ok {
		return
	}
	if id, err := uuid.Parse(ev.ID); err == nil {
		w.Wake(id)
	}
}

// LongPolls is the number of GET /tasks/{id} long-polls waiting on a task
// in this process.
func (s *Service) LongPolls(id uuid.UUID) int { return s.watch.Waiting(id) }
