package events

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

// OneOrder is implemented by a Bus that delivers every node's emissions in
// the same order on every node (PostgreSQL's NOTIFY queue), so that an
// offset names the same event on any node and a client may recover its
// session on another node.
type OneOrder interface {
	Bus
	OneOrder() bool
}

// DeliversInOneOrder reports whether b delivers in one order on every node.
func DeliversInOneOrder(b Bus) bool {
	o, ok := b.(OneOrder)
	return ok && o.OneOrder()
}

// TxBus is a Bus whose delivery to other nodes rides inside the mutation's
// own database transaction: the mutation sends Notification's payload with
// pg_notify(Channel(), payload) before it commits, so PostgreSQL delivers it
// exactly when the change commits and never without it, at no extra round
// trip. After the commit the caller hands the same emissions to Deliver for
// this node's subscribers; nothing is delivered in-process before the commit.
type TxBus interface {
	Bus
	// Channel is the NOTIFY channel the nodes listen on.
	Channel() string
	// Notification encodes ems as one NOTIFY payload for Channel().
	Notification(ctx context.Context, ems []Emission) (string, error)
	// Frame describes a one-event batch to a statement that builds the
	// payload from the row it changes (see NotifyFrame).
	Frame(eventName string) NotifyFrame
	// Deliver is called with the emissions after the commit. Buses that
	// deliver to this node's subscribers from their own stream (PGBus: every
	// node, the originating one included, delivers in the NOTIFY queue's
	// single order) do nothing here.
	Deliver(ems []Emission)
}

// NotifyFrame is the constant text around the events of a NOTIFY payload
// that a statement builds from the rows it changes: the payload is Head, the
// events' items separated by commas, then Tail; an item is Open + room as a
// JSON string + Middle + the event's JSON object + Close, sent with
// pg_notify(Channel, ...). One statement writes all its events as one
// payload when they fit (see models.HotNotify).
type NotifyFrame struct {
	Channel, Head, Open, Middle, Close, Tail string
	// ID is the batch id the head carries: the rows a statement writes
	// with this frame come back to this node's listener under it (see
	// PGBus.OnEcho).
	ID uint64
}

// Item is the item of one event in a frame's payload: room and event are
// JSON (a string and an object).
func (f NotifyFrame) Item(room, event string) string {
	return f.Open + room + f.Middle + event + f.Close
}

// Payload is the frame's payload carrying items (see Item).
func (f NotifyFrame) Payload(items ...string) string {
	return f.Head + strings.Join(items, ",") + f.Tail
}

// EventMiddle is the Middle of a frame item for an event of that name: a
// statement whose payload carries events of several names takes each one's
// from here.
func EventMiddle(eventName string) string {
	name, _ := json.Marshal(eventName)
	return `,"t":` + string(name) + `,"p":`
}

// LocalBus is the in-process Bus for a single node. The zero value is ready.
type LocalBus struct {
	mu   sync.RWMutex
	next int
	subs map[int]func(Emission)

	// Offsets of published emissions: a random prefix per bus (so that an
	// offset of an earlier process never names an emission of this one) and
	// a counter.
	offOnce   sync.Once
	offPrefix string
	offSeq    atomic.Uint64
}

// NewLocalBus returns an empty in-process bus.
func NewLocalBus() *LocalBus { return &LocalBus{} }

// Publish implements Bus: it names each emission with an offset of this bus
// and delivers it to the subscribers.
func (b *LocalBus) Publish(_ context.Context, ems []Emission) error {
	b.offOnce.Do(func() {
		var r [4]byte
		_, _ = rand.Read(r[:])
		b.offPrefix = hex.EncodeToString(r[:]) + "-"
	})
	named := make([]Emission, len(ems))
	for i, e := range ems {
		if e.Offset == "" {
			e.Offset = b.offPrefix + strconv.FormatUint(b.offSeq.Add(1), 36)
		}
		named[i] = e
	}
	b.Deliver(named)
	return nil
}

// Deliver hands emissions to this node's subscribers only, as they are.
// Multi-node buses use it for what they receive from their stream.
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
