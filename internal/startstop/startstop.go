// Package startstop is the one start/stop contract of joblib's background
// services: Start(ctx) backgrounds the service and returns, Stop() is
// idempotent and blocks until its goroutines have exited.
package startstop

import (
	"context"
	"errors"
	"sync"
)

// ErrStop is the cancellation cause of a service context when Stop is called.
var ErrStop = errors.New("service stopped")

// Base is embedded by a service. The zero value is ready.
type Base struct {
	mu       sync.Mutex
	cancel   context.CancelCauseFunc
	stopping bool
	wg       sync.WaitGroup
	started  chan struct{}
	stopped  chan struct{}
}

// StartInit begins a Start: it reports false if the service is already
// running, otherwise returns the service's own context (cancelled with
// ErrStop on Stop, detached from ctx's cancellation but keeping its values).
func (b *Base) StartInit(ctx context.Context) (context.Context, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cancel != nil {
		return nil, false
	}
	sctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	b.cancel = cancel
	b.started = make(chan struct{})
	b.stopped = make(chan struct{})
	close(b.started)
	return sctx, true
}

// Go runs fn on a goroutine that Stop waits for.
func (b *Base) Go(fn func()) {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		fn()
	}()
}

// Stop cancels the service context and waits for every goroutine started
// with Go. It is idempotent and safe to call concurrently or before Start.
func (b *Base) Stop() {
	b.mu.Lock()
	cancel, stopped, first := b.cancel, b.stopped, b.cancel != nil && !b.stopping
	if first {
		b.stopping = true
	}
	b.mu.Unlock()
	switch {
	case cancel == nil:
		return
	case !first:
		<-stopped // another Stop is in progress
		return
	}
	cancel(ErrStop)
	b.wg.Wait()
	b.mu.Lock()
	b.cancel, b.stopping = nil, false
	b.mu.Unlock()
	close(stopped)
}

// Started is closed once the service has started (nil before the first Start).
func (b *Base) Started() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.started
}

// Stopped is closed once a started service has fully stopped.
func (b *Base) Stopped() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stopped
}
