package events

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/zndraw/joblib/internal/startstop"
)

// PGBus is the multi-node Bus: emissions are sent with PostgreSQL NOTIFY on
// one channel, and every node, the originating one included, delivers them
// to its subscribers as its LISTEN connection receives them. PostgreSQL
// queues notifications in commit order, so every node delivers the same
// emissions in the same order (which is what lets an offset of one node
// name the same point on another, and keeps a task's status events in
// commit order). Batches too large for a NOTIFY payload are stored in an
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

	mon   Monitor
	seqs  sequencer
	ids   atomic.Uint64 // statement batch ids (Frame)
	names offsetNamer
	track *seqTracker
	// scope is the schema this deployment lives in (see wireBatch.Scope).
	scope string
	// listenerPID is the backend of the LISTEN connection (tests).
	listenerPID atomic.Uint32
	// echo is OnEcho's func(uint64), nil until set.
	echo atomic.Value
	// heard is when the listener last received a batch of this deployment,
	// as the time since born (so that it keeps the monotonic clock); 0
	// before the first.
	born  time.Time
	heard atomic.Int64

	life  startstop.Base // the listener, the spill cleaner, the gap expiry
	mu    sync.Mutex
	ready chan struct{}
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

// NewPGBus builds a bus over pool; node must be unique per running process.
// Call Start before publishing.
func NewPGBus(pool *pgxpool.Pool, node string, log *slog.Logger) *PGBus {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &PGBus{LocalBus: NewLocalBus(), pool: pool, node: node, log: log, ready: make(chan struct{}), channel: Channel, track: newSeqTracker(ReorderWindow), born: time.Now()}
}

// OneOrder implements OneOrder: every node reads one NOTIFY queue.
func (b *PGBus) OneOrder() bool { return true }

// Monitor implements Monitored.
func (b *PGBus) Monitor() *Monitor { return &b.mon }

// ListenerPID is the PostgreSQL backend pid of the LISTEN connection (0
// before the first one): operators and tests can find, or end, it.
func (b *PGBus) ListenerPID() uint32 { return b.listenerPID.Load() }

// Start checks that the schema has the spill table, starts listening and starts
// deleting old spilled batches every SpillCleanInterval. It returns once the
// listener is subscribed (so nothing published afterwards by other nodes is
// missed) or ctx ends.
func (b *PGBus) Start(ctx context.Context) error {
	if err := b.pool.QueryRow(ctx, "SELECT current_schema()").Scan(&b.scope); err != nil {
		return fmt.Errorf("read the bus scope: %w", err)
	}
	if err := b.checkSpill(ctx); err != nil {
		return err
	}
	b.mu.Lock()
	b.channel = Channel
	if b.scope != "public" {
		b.channel = Channel + "_" + b.scope
	}
	b.mu.Unlock()
	lctx, ok := b.life.StartInit(ctx)
	if !ok {
		return nil // running already
	}
	b.life.Go(func() { b.listen(lctx) })
	b.life.Go(func() { b.cleanSpill(lctx) })
	b.life.Go(func() { expireLoop(lctx, b.track, &b.mon, b.log) })
	select {
	case <-b.ready:
		return nil
	case <-ctx.Done():
		b.life.Stop()
		return ctx.Err()
	}
}

// checkSpill fails Start when the schema lacks the spill table: it belongs to
// the migrations (version 50), which every joblib command runs before it
// starts a bus, so its absence means the bus was pointed at a schema joblib
// never migrated.
func (b *PGBus) checkSpill(ctx context.Context) error {
	var exists bool
	if err := b.pool.QueryRow(ctx, "SELECT to_regclass('joblib_event_spill') IS NOT NULL").Scan(&exists); err != nil {
		return fmt.Errorf("look up event spill table: %w", err)
	}
	if !exists {
		return fmt.Errorf("event spill table joblib_event_spill missing in schema %q: run `joblib migrate` first", b.scope)
	}
	return nil
}

// Stop ends the listener, the spill cleaner and the gap expiry, and waits
// for them (the startstop contract).
func (b *PGBus) Stop() { b.life.Stop() }

// Publish implements Bus for emissions that no transaction produced: one
// NOTIFY of its own, which every node (this one included) delivers.
// Mutations use Notification inside their transaction instead.
func (b *PGBus) Publish(ctx context.Context, ems []Emission) error {
	if len(ems) == 0 {
		return nil
	}
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

// Deliver implements TxBus. It does nothing: this node's subscribers get the
// emissions from the LISTEN connection, in the order every node shares.
func (b *PGBus) Deliver([]Emission) {}

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
	msg, err := encodeBatch(b.node, b.scope, b.seqs.next(), ems)
	if err != nil {
		return "", err
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
	msg, _ = json.Marshal(wireBatch{Node: b.node, Scope: b.scope, Ref: id})
	return string(msg), nil
}

// Frame implements TxBus: a statement batch of n events is exactly
// head + n items separated by commas + tail, each item
// open + JSON(room) + middle + payload + close, so a statement can build the
// NOTIFY payload from the rows it changes. Statements whose payload may
// reach maxNotify must use Notification instead. Each call names a new
// statement batch (the head carries its id): call it once per statement.
func (b *PGBus) Frame(eventName string) NotifyFrame {
	node, _ := json.Marshal(b.node)
	scope, _ := json.Marshal(b.scope)
	id := b.ids.Add(1)
	return NotifyFrame{
		ID:      id,
		Channel: b.Channel(),
		Head:    `{"n":` + string(node) + `,"d":` + string(scope) + `,"i":` + strconv.FormatUint(id, 10) + `,"e":[`,
		Open:    `{"r":`,
		Middle:  EventMiddle(eventName),
		Close:   `}`,
		Tail:    `]}`,
	}
}

// MaxNotifyBytes is the largest NOTIFY payload a statement may send inline.
const MaxNotifyBytes = maxNotify

// cleanSpill deletes spilled batches older than SpillRetention (by the
// database's clock) every SpillCleanInterval, whether or not anything is
// spilled meanwhile, until ctx ends. Every node does it; the statement is
// cheap and idempotent.
func (b *PGBus) cleanSpill(ctx context.Context) {
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
	backoff := time.Second
	var once sync.Once
	first := true
	subscribed := func() {
		if !first {
			// Whatever the other nodes published while this listener was
			// away is lost: say so, so clients refetch.
			b.track.reset()
			b.log.Warn("event listener reconnected; emissions of other nodes may have been missed")
			b.mon.gap(Gap{Reason: GapReconnect})
		}
		first = false
		once.Do(func() { close(b.ready) })
	}
	for ctx.Err() == nil {
		err := b.listenOnce(ctx, subscribed)
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
	b.listenerPID.Store(conn.PgConn().PID())
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
	batch, err := decodeWire([]byte(payload))
	if err != nil {
		b.log.Warn("undecodable event batch", "err", err)
		return
	}
	if batch.Scope != b.scope {
		return
	}
	b.heard.Store(max(1, int64(time.Since(b.born))))
	if ref := batch.Ref; ref != 0 {
		var raw string
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := b.pool.QueryRow(qctx, "SELECT payload FROM joblib_event_spill WHERE id = $1", ref).Scan(&raw)
		cancel()
		if err == nil {
			batch, err = decodeWire([]byte(raw))
		}
		if err != nil {
			b.log.Warn("read spilled event batch", "ref", ref, "err", err)
			return
		}
	}
	if batch.ID != 0 && batch.Node == b.node {
		if fn, _ := b.echo.Load().(func(uint64)); fn != nil {
			fn(batch.ID)
		}
	}
	receiveBatch(batch, b.LocalBus, &b.names, b.track, &b.mon, b.log)
}

// OnEcho makes the listener call fn with the id of every batch of this
// node's frames (Frame) it receives: the relay of some node has sent it,
// and with it every row of the statement that used the frame. The outbox
// relay uses it to skip a pass that would find its rows already sent. fn
// runs on the listener and must not block; a later call replaces it.
func (b *PGBus) OnEcho(fn func(frame uint64)) { b.echo.Store(fn) }

// LastHeard is when the listener last received a batch of this deployment,
// from any node (the zero time before the first). Batches arrive when a
// relay pass, of any node, commits: the outbox relay spaces its passes from
// the last one heard, so that the nodes of a busy deployment do not each run
// one per gap.
func (b *PGBus) LastHeard() time.Time {
	d := b.heard.Load()
	if d == 0 {
		return time.Time{}
	}
	return b.born.Add(time.Duration(d))
}

var _ TxBus = (*PGBus)(nil)
