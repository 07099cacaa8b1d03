package startstop

import (
	"context"
	"fmt"
	"sync"
)

// Service is the contract: Start backgrounds the service and returns (an
// error when it could not start); Stop is idempotent and returns once the
// service's goroutines have exited.
type Service interface {
	Start(ctx context.Context) error
	Stop()
}

// Part is one named step of a Sequence. Start may be nil (a part that only
// has something to undo), and so may Stop (nothing to undo).
type Part struct {
	Name  string
	Start func(ctx context.Context) error
	Stop  func()
}

// Of is the part that starts and stops svc.
func Of(name string, svc Service) Part {
	return Part{Name: name, Start: svc.Start, Stop: svc.Stop}
}

// Sequence starts its parts in order and stops the started ones in reverse:
// a part may use everything started before it, for as long as it runs.
type Sequence struct {
	parts []Part

	mu      sync.Mutex
	started int // parts[:started] are running
}

// NewSequence is the sequence of parts, in start order.
func NewSequence(parts ...Part) *Sequence { return &Sequence{parts: parts} }

// Start starts each part in turn. When one fails, the parts already started
// are stopped (in reverse) and the error names the part that failed.
func (q *Sequence) Start(ctx context.Context) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.started < len(q.parts) {
		p := q.parts[q.started]
		if p.Start != nil {
			if err := p.Start(ctx); err != nil {
				q.stopLocked()
				return fmt.Errorf("%s: %w", p.Name, err)
			}
		}
		q.started++
	}
	return nil
}

// Stop stops the started parts, the last started first. It is idempotent.
func (q *Sequence) Stop() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.stopLocked()
}

func (q *Sequence) stopLocked() {
	for ; q.started > 0; q.started-- {
		if p := q.parts[q.started-1]; p.Stop != nil {
			p.Stop()
		}
	}
}

// Names lists the parts in start order.
func (q *Sequence) Names() []string {
	out := make([]string, len(q.parts))
	for i, p := range q.parts {
		out[i] = p.Name
	}
	return out
}
