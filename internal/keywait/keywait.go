// Package keywait lets goroutines wait for "key K changed" signals without
// polling: the result caches use it to wake provider-read long-polls on an
// upload, whether the upload happened here or (through NOTIFY) on another node.
package keywait

import (
	"context"
	"sync"
	"time"
)

// Registry maps keys to the channels of their current waiters. The zero value
// is not usable; call New.
type Registry[K comparable] struct {
	mu      sync.Mutex
	waiters map[K]map[chan struct{}]struct{}
}

// New returns an empty registry.
func New[K comparable]() *Registry[K] {
	return &Registry[K]{waiters: map[K]map[chan struct{}]struct{}{}}
}

// Subscribe registers a waiter for k. The channel receives a value after
// every Wake(k) (signals coalesce: one buffered slot). Subscribe before
// checking the state the key guards, so that no change slips in between.
// Call cancel when done.
func (r *Registry[K]) Subscribe(k K) (ch <-chan struct{}, cancel func()) {
	c := make(chan struct{}, 1)
	r.mu.Lock()
	if r.waiters[k] == nil {
		r.waiters[k] = map[chan struct{}]struct{}{}
	}
	r.waiters[k][c] = struct{}{}
	r.mu.Unlock()
	return c, func() {
		r.mu.Lock()
		delete(r.waiters[k], c)
		if len(r.waiters[k]) == 0 {
			delete(r.waiters, k)
		}
		r.mu.Unlock()
	}
}

// Wake signals every current waiter of k. It never blocks.
func (r *Registry[K]) Wake(k K) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for c := range r.waiters[k] {
		signal(c)
	}
}

// WakeAll signals every waiter of every key (after a gap in which signals
// may have been missed, e.g. a lost LISTEN connection).
func (r *Registry[K]) WakeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, cs := range r.waiters {
		for c := range cs {
			signal(c)
		}
	}
}

// Waiting is the number of current waiters of k.
func (r *Registry[K]) Waiting(k K) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.waiters[k])
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default: // already signalled; the waiter re-checks anyway
	}
}

// Wait is the race-free long-poll over a registry: it subscribes to k, runs
// check (a hit returns at once), then re-runs check after every wake-up until
// it hits, timeout passes (one last check then), or ctx ends. timeout <= 0
// means check once. check must not block for long; no resource is held while
// waiting.
func Wait[K comparable, V any](ctx context.Context, r *Registry[K], k K, timeout time.Duration,
	check func(context.Context) (V, bool, error)) (V, bool, error) {
	ch, cancel := r.Subscribe(k)
	defer cancel()
	if v, ok, err := check(ctx); err != nil || ok || timeout <= 0 {
		return v, ok, err
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			var zero V
			return zero, false, context.Cause(ctx)
		case <-timer.C:
			// A last look covers a wake-up lost in transit (e.g. while a
			// LISTEN connection was being re-established).
			return check(ctx)
		case <-ch:
			if v, ok, err := check(ctx); err != nil || ok {
				return v, ok, err
			}
		}
	}
}
