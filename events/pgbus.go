package events

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PGBus is the multi-node Bus: emissions are delivered to this node's
// subscribers at once and sent to the other nodes with PostgreSQL NOTIFY on
// one channel. Batches too large for a NOTIFY payload are stored in an
// unlogged spill table and referenced by id. Delivery between nodes is
// at-most-once (NOTIFY has no replay while a listener reconnects); the
// state itself is always in the database, and the events only say
// "refetch".
type PGBus struct {
	*LocalBus
	pool *pgxpool.Pool
	node string
	log  *slog.Logger

	// SpillRetention is how long a spilled batch is kept for slow
	// listeners, and SpillCleanInterval how often older ones are deleted.
	// Set them before Start; zero means the defaults (5 min, 1 min).
	SpillRetention     time.Duration
	SpillCleanInterval time.Duration

	mu      sync.Mutex
	cancel  context.CancelFunc
	done    chan struct{}
	cleaned chan struct{}
	ready   chan struct{}
	// channel is Channel, qualified by the schema (set by Start).
	channel string
}

// Channel is the NOTIFY channel joblib nodes share when their tables are in
// the public schema. NOTIFY channels belong to the whole database, so nodes
// whose tables live in another schema (a deployment per schema, or tests)
// use Channel + "_" + schema: deployments sharing a database never hear each
// other's events.
const Channel = "joblib_events"

// maxNotify is the largest NOTIFY payload sent inline; PostgreSQL refuses
// 8000 bytes and more.
const maxNotify = 7900

// Defaults of PGBus.SpillRetention and PGBus.SpillCleanInterval.
const (
	DefaultSpillRetention     = 5 * time.Minute
	DefaultSpillCleanInterval = time.Minute
)

// NewPGBus builds a bus over pool; node must be unique per running process
// (its own messages are skipped on receipt). Call Start before publishing.
func NewPGBus(pool *pgxpool.Pool, node string, log *slog.Logger) *PGBus {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &PGBus{LocalBus: NewLocalBus(), pool: pool, node: node, log: log, ready: make(chan struct{}), channel: Channel}
}

type wireBatch struct {
	Node  string     `json:"n"`
	Ref   int64      `json:"ref,omitempty"`
	Items []wireItem `json:"e,omitempty"`
}

type wireItem struct {
	Room    string          `json:"r"`
	Name    string          `json:"t"`
	Payload json.RawMessage `json:"p"`
}

// Start creates the spill table if needed, starts listening and starts
// deleting old spilled batches every SpillCleanInterval. It returns once the
// listener is subscribed (so nothing published afterwards by other nodes is
// missed) or ctx ends.
func (b *PGBus) Start(ctx context.Context) error {
	_, err := b.pool.Exec(ctx, `CREATE UNLOGGED TABLE IF NOT EXISTS joblib_event_spill (
		id bigserial PRIMARY KEY, payload text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`)
	if err != nil {
		return fmt.Errorf("create event spill table: %w", err)
	}
	var schema string
	if err := b.pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		return fmt.Errorf("read schema: %w", err)
	}
	b.mu.Lock()
	b.channel = Channel
	if schema != "public" {
		b.channel = Channel + "_" + schema
	}
	b.mu.Unlock()
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	b.mu.Lock()
	b.cancel = cancel
	b.done = make(chan struct{})
	b.cleaned = make(chan struct{})
	b.mu.Unlock()
	go b.listen(lctx)
	go b.cleanSpill(lctx)
	select {
	case <-b.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stop ends the listener and the spill cleaner and waits for them.
func (b *PGBus) Stop() {
	b.mu.Lock()
	cancel, done, cleaned := b.cancel, b.done, b.cleaned
	b.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
	<-cleaned
}

// Publish implements Bus for emissions that no transaction produced: local
// subscribers first, then the other nodes with a NOTIFY of its own.
// Mutations use Notification inside their transaction instead.
func (b *PGBus) Publish(ctx context.Context, ems []Emission) error {
	if len(ems) == 0 {
		return nil
	}
	b.Deliver(ems)
	msg, err := b.Notification(ctx, ems)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := b.pool.Exec(ctx, "SELECT pg_notify($1, $2)", b.Channel(), msg); err != nil {
		return fmt.Errorf("notify event batch: %w", err)
	}
	return nil
}

// Channel implements TxBus: the NOTIFY channel of this bus's nodes.
func (b *PGBus) Channel() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.channel
}

// Notification implements TxBus: the NOTIFY payload on Channel() that carries
// ems to the other nodes. A batch too large for NOTIFY is stored in the spill
// table first (in its own short transaction: a spilled batch whose NOTIFY
// never commits is only garbage, deleted by the spill cleaner) and referenced
// by id.
func (b *PGBus) Notification(ctx context.Context, ems []Emission) (string, error) {
	batch := wireBatch{Node: b.node, Items: make([]wireItem, len(ems))}
	for i, e := range ems {
		batch.Items[i] = wireItem{Room: e.Room, Name: e.Event.EventName(), Payload: e.Payload()}
	}
	msg, err := json.Marshal(batch)
	if err != nil {
		return "", fmt.Errorf("encode event batch: %w", err)
	}
	if len(msg) < maxNotify {
		return string(msg), nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var id int64
	if err := b.pool.QueryRow(ctx, "INSERT INTO joblib_event_spill (payload) VALUES ($1) RETURNING id", string(msg)).Scan(&id); err != nil {
		return "", fmt.Errorf("spill event batch: %w", err)
	}
	msg, _ = json.Marshal(wireBatch{Node: b.node, Ref: id})
	return string(msg), nil
}

// Frame implements TxBus: a one-event batch is exactly
// prefix + JSON(room) + middle + payload + suffix, so a statement can build
// the NOTIFY payload from the row it changes. Statements whose payload may
// reach maxNotify must use Notification instead.
func (b *PGBus) Frame(eventName string) NotifyFrame {
	node, _ := json.Marshal(b.node)
	name, _ := json.Marshal(eventName)
	return NotifyFrame{
		Channel: b.Channel(),
		Prefix:  `{"n":` + string(node) + `,"e":[{"r":`,
		Middle:  `,"t":` + string(name) + `,"p":`,
		Suffix:  `}]}`,
	}
}

// MaxNotifyBytes is the largest NOTIFY payload a statement may send inline.
const MaxNotifyBytes = maxNotify

// cleanSpill deletes spilled batches older than SpillRetention (by the
// database's clock) every SpillCleanInterval, whether or not anything is
// spilled meanwhile, until ctx ends. Every node does it; the statement is
// cheap and idempotent.
func (b *PGBus) cleanSpill(ctx context.Context) {
	defer close(b.cleaned)
	keep := cmp.Or(b.SpillRetention, DefaultSpillRetention)
	t := time.NewTicker(cmp.Or(b.SpillCleanInterval, DefaultSpillCleanInterval))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := b.pool.Exec(qctx, "DELETE FROM joblib_event_spill WHERE created_at < now() - $1 * interval '1 millisecond'", keep.Milliseconds())
		cancel()
		if err != nil && ctx.Err() == nil {
			b.log.Warn("clean event spill table", "err", err)
		}
	}
}

// listen holds one pooled connection with LISTEN and delivers what other
// nodes publish; it reconnects with jittered backoff.
func (b *PGBus) listen(ctx context.Context) {
	defer close(b.done)
	backoff := time.Second
	var once sync.Once
	for ctx.Err() == nil {
		err := b.listenOnce(ctx, func() { once.Do(func() { close(b.ready) }) })
		if ctx.Err() != nil {
			return
		}
		b.log.Error("event listener lost; reconnecting", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff + time.Duration(rand.Int64N(int64(backoff/5)+1))):
		}
		backoff = min(backoff*2, 30*time.Second)
	}
}

func (b *PGBus) listenOnce(ctx context.Context, subscribed func()) error {
	pooled, err := b.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// The connection will be LISTENing: take it out of the pool for good so
	// it is never handed to another user, and close it when done.
	conn := pooled.Hijack()
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{b.Channel()}.Sanitize()); err != nil {
		return err
	}
	subscribed()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		b.receive(ctx, n.Payload)
	}
}

func (b *PGBus) receive(ctx context.Context, payload string) {
	var batch wireBatch
	if err := json.Unmarshal([]byte(payload), &batch); err != nil {
		b.log.Warn("undecodable event batch", "err", err)
		return
	}
	if batch.Node == b.node {
		return
	}
	if batch.Ref != 0 {
		var raw string
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := b.pool.QueryRow(qctx, "SELECT payload FROM joblib_event_spill WHERE id = $1", batch.Ref).Scan(&raw)
		cancel()
		if err == nil {
			err = json.Unmarshal([]byte(raw), &batch)
		}
		if err != nil {
			b.log.Warn("read spilled event batch", "ref", batch.Ref, "err", err)
			return
		}
	}
	ems := make([]Emission, 0, len(batch.Items))
	for _, it := range batch.Items {
		ev, err := Decode(it.Name, it.Payload)
		if err != nil {
			b.log.Warn("undecodable event", "err", err)
			continue
		}
		ems = append(ems, Emission{Room: it.Room, Event: ev})
	}
	b.Deliver(ems)
}

var _ TxBus = (*PGBus)(nil)
