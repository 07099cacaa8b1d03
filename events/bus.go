package events

import (
	"context"
	"sync"
)

// Bus delivers committed emissions to subscribers (the Socket.IO hub, the
// long-poll waiters). Publish is called only after the transaction that caused
// the emissions has committed.
type Bus interface {
	// Publish delivers the emissions to every subscriber, on this node and,
	// for multi-node buses, on the others.
	Publish(ctx context.Context, ems []Emission) error
	// Subscribe registers fn for every published emission and returns a
	// function that removes it. fn runs on the publisher's goroutine and must
	// not block: hand work off to a buffered queue and drop or disconnect on
	// overflow.
	Subscribe(fn func(Emission)) (unsubscribe func())
}

// LocalBus is the in-process Bus for a single node. The zero value is ready.
type LocalBus struct {
	mu   sync.RWMutex
	next int
	subs map[int]func(Emission)
}

// NewLocalBus returns an empty in-process bus.
func NewLocalBus() *LocalBus { return &LocalBus{} }

// Publish implements Bus.
func (b *LocalBus) Publish(_ context.Context, ems []Emission) error {
	b.Deliver(ems)
	return nil
}

// Deliver hands emissions to this node's subscribers only. Multi-node buses
// use it for what they receive from other nodes.
func (b *LocalBus) Deliver(ems []Emission) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	for _, e := range ems {
		for _, fn := range b.subs {
			fn(e)
		}
	}
}

// Subscribe implements Bus.
func (b *LocalBus) Subscribe(fn func(Emission)) func() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.subs == nil {
		b.subs = map[int]func(Emission){}
	}
	id := b.next
	b.next++
	b.subs[id] = fn
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		delete(b.subs, id)
	}
}
