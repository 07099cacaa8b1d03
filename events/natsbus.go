package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/zndraw/joblib/internal/startstop"
)

// DefaultSubject is the NATS subject joblib nodes share by default.
const DefaultSubject = "joblib.events"

// NATSBus is the multi-node Bus over a NATS server, for deployments whose
// event rate outgrows PostgreSQL NOTIFY (every NOTIFY takes a global lock at
// commit). Emissions are published, after commit, on one subject, and every
// node, the publishing one included, delivers them as its subscription
// receives them: in the one order the NATS server gives the subject. NATS core delivery is
// at-most-once: batches carry per-node sequence numbers, and a gap or a
// reconnect is reported through Monitor so that clients refetch.
type NATSBus struct {
	*LocalBus
	url     string
	subject string
	node    string
	log     *slog.Logger

	mon   Monitor
	track *seqTracker
	names offsetNamer

	pubMu sync.Mutex // numbers and sends in one order
	seq   uint64

	life startstop.Base // the gap expiry
	mu   sync.Mutex
	nc   *nats.Conn
	sub  *nats.Subscription
}

// NewNATSBus builds a bus on the NATS server at url (nats://host:port),
// sharing subject with the other nodes (DefaultSubject when empty); node must
// be unique per running process. Call Start before publishing.
func NewNATSBus(url, subject, node string, log *slog.Logger) *NATSBus {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if subject == "" {
		subject = DefaultSubject
	}
	return &NATSBus{LocalBus: NewLocalBus(), url: url, subject: subject, node: node, log: log, track: newSeqTracker(ReorderWindow)}
}

// Monitor implements Monitored.
func (b *NATSBus) Monitor() *Monitor { return &b.mon }

// Start connects and subscribes; it returns once the subscription is in
// place on the server (nothing published afterwards is missed).
func (b *NATSBus) Start(ctx context.Context) error {
	opts := []nats.Option{
		nats.Name("joblib " + b.node),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectJitter(100*time.Millisecond, time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				b.log.Error("event bus connection lost; reconnecting", "err", err)
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) {
			b.track.reset()
			b.log.Warn("event bus reconnected; emissions of other nodes may have been missed")
			b.mon.gap(Gap{Reason: GapReconnect})
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrSlowConsumer) {
				// Messages were dropped for this subscriber; the sequence
				// check reports the gap.
				b.log.Error("event bus: slow consumer, messages dropped", "err", err)
				return
			}
			b.log.Error("event bus", "err", err)
		}),
	}
	if d, ok := ctx.Deadline(); ok {
		opts = append(opts, nats.Timeout(time.Until(d)))
	}
	nc, err := nats.Connect(b.url, opts...)
	if err != nil {
		return fmt.Errorf("connect to event bus %s: %w", b.url, err)
	}
	sub, err := nc.Subscribe(b.subject, b.receive)
	if err == nil {
		err = sub.SetPendingLimits(1<<20, 1<<30)
	}
	if err == nil {
		err = nc.FlushWithContext(ctx)
	}
	if err != nil {
		nc.Close()
		return fmt.Errorf("subscribe to event bus %s: %w", b.subject, err)
	}
	lctx, ok := b.life.StartInit(ctx)
	if !ok {
		nc.Close()
		return nil // running already
	}
	b.mu.Lock()
	b.nc, b.sub = nc, sub
	b.mu.Unlock()
	b.life.Go(func() { expireLoop(lctx, b.track, &b.mon, b.log) })
	return nil
}

// Stop ends the gap expiry and closes the connection (the startstop
// contract).
func (b *NATSBus) Stop() {
	b.life.Stop()
	b.mu.Lock()
	nc := b.nc
	b.nc = nil
	b.mu.Unlock()
	if nc != nil {
		nc.Close()
	}
}

// Publish implements Bus: one message on the subject, which every node
// (this one included) delivers.
func (b *NATSBus) Publish(ctx context.Context, ems []Emission) error {
	if len(ems) == 0 {
		return nil
	}
	b.mu.Lock()
	nc := b.nc
	b.mu.Unlock()
	if nc == nil {
		return errors.New("publish event batch: the NATS bus is not started")
	}
	b.pubMu.Lock()
	defer b.pubMu.Unlock()
	b.seq++
	msg, err := encodeBatch(b.node, "", b.seq, ems)
	if err != nil {
		return err
	}
	if err := nc.Publish(b.subject, msg); err != nil {
		return fmt.Errorf("publish event batch: %w", err)
	}
	return nil
}

func (b *NATSBus) receive(m *nats.Msg) {
	batch, err := decodeWire(m.Data)
	if err != nil {
		b.log.Warn("undecodable event batch", "err", err)
		return
	}
	receiveBatch(batch, b.LocalBus, &b.names, b.track, &b.mon, b.log)
}

var _ Bus = (*NATSBus)(nil)
