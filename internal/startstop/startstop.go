// Package startstop is the start/stop contract every background service
// follows: Start(ctx) backgrounds the service and returns at once, Stop() is
// idempotent and blocks until its goroutines have exited, and Started() and
// Stopped() are channels closed at those moments. Embed Base and call
// StartInit from Start.
package startstop

import (
	"context"
	"errors"
	"sync"
)

// ErrStop is the cause of a service context cancelled by Stop.
var ErrStop = errors.New("service stopped")

// Base implements the contract's bookkeeping. The zero value is ready.
type Base struct {
	mu      sync.Mutex
	cancel  context.CancelCauseFunc
	started chan struct{}
	stopped chan struct{}
}

func (b *Base) init() {
	if b.started == nil {
		b.started = make(chan struct{})
		b.stopped = make(chan struct{})
	}
}

// StartInit prepares a start. When shouldStart is false the service is
// already running and Start must return nil at once. Otherwise the service
// runs its goroutine on ctx (cancelled with cause ErrStop by Stop), calls
// started() once it is up and stopped() as the goroutine's last act.
func (b *Base) StartInit(parent context.Context) (ctx context.Context, shouldStart bool, started, stopped func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cancel != nil {
		return nil, false, nil, nil
	}
	b.init()
	// A stopped service can be started again.
	select {
	case <-b.stopped:
		b.started = make(chan struct{})
		b.stopped = make(chan struct{})
	default:
	}
	ctx, cancel := context.WithCancelCause(parent)
	b.cancel = cancel
	startedCh, stoppedCh := b.started, b.stopped
	var once sync.Once
	return ctx, true, func() { once.Do(func() { close(startedCh) }) }, func() {
		once.Do(func() { close(startedCh) })
		b.mu.Lock()
		if b.stopped == stoppedCh {
			b.cancel = nil
		}
		b.mu.Unlock()
		close(stoppedCh)
	}
}

// Stop cancels the service and waits until it has stopped. It is safe to
// call at any time, any number of times, from any goroutine.
func (b *Base) Stop() {
	b.mu.Lock()
	cancel := b.cancel
	b.init()
	stopped := b.stopped
	b.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel(ErrStop)
	<-stopped
}

// Started is closed once the service is up.
func (b *Base) Started() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.init()
	return b.started
}

// Stopped is closed once the service has stopped.
func (b *Base) Stopped() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.init()
	return b.stopped
}
