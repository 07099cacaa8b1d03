package joblib

import (
	"sync"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
)

// taskWatch wakes long-polls on a task's change. It listens to the bus, so a
// change committed on another node (delivered by a multi-node bus) wakes a
// waiter here as well.
type taskWatch struct {
	mu      sync.Mutex
	waiters map[uuid.UUID]map[chan struct{}]struct{}
}

func newTaskWatch() *taskWatch {
	return &taskWatch{waiters: map[uuid.UUID]map[chan struct{}]struct{}{}}
}

// subscribe returns a channel that receives a value after the task changes,
// and a function to stop watching. Subscribe before reading the task so that
// no change can slip between the read and the wait.
func (w *taskWatch) subscribe(id uuid.UUID) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	if w.waiters[id] == nil {
		w.waiters[id] = map[chan struct{}]struct{}{}
	}
	w.waiters[id][ch] = struct{}{}
	w.mu.Unlock()
	return ch, func() {
		w.mu.Lock()
		delete(w.waiters[id], ch)
		if len(w.waiters[id]) == 0 {
			delete(w.waiters, id)
		}
		w.mu.Unlock()
	}
}

func (w *taskWatch) observe(e events.Emission) {
	ev, ok := e.Event.(events.TaskStatusEvent)
	if !ok {
		return
	}
	id, err := uuid.Parse(ev.ID)
	if err != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for ch := range w.waiters[id] {
		select {
		case ch <- struct{}{}:
		default: // already signalled; the waiter re-reads the task anyway
		}
	}
}
