package joblib

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/startstop"
)

// The outbox relay (PostgreSQL with a TxBus): mutations write the events
// other nodes must hear to the event outbox in their own statement or
// transaction (see models.RelayOutbox); the relay sends what has committed.
// It is woken after each commit that wrote to the outbox, so an event leaves
// about one round trip after its change committed, and it also runs every
// relayInterval, which sends what a node that died between its commit and
// its relay left behind. Every node relays; the relays of one schema take
// turns (a lock), so the rows go out in order.

// relayInterval is how often the relay looks for rows nobody was woken for.
const relayInterval = time.Second

// relayBatch is the most rows one relay transaction sends.
const relayBatch = 500

// relayMinGap spaces the passes of a busy relay. A pass costs PostgreSQL a
// transaction (the relay lock, the DELETE, a commit that wakes the listener
// of every node) whether it carries one event or fifty, and a relay woken
// after every commit ran back to back under load with one or two events per
// pass: 2.3 passes per task in the contract flow. A wake within relayMinGap
// of the previous pass's start waits for the rest of the gap, so a pass
// carries what several commits wrote (0.8 passes per task, BENCHMARKS.md),
// at the price of at most relayMinGap of extra latency under load; a wake
// after a quiet spell runs at once.
const relayMinGap = 3 * time.Millisecond

type relay struct {
	// life runs the loop: a Stop waits for the last pass, and a second
	// Stop at the same time waits for the first.
	life startstop.Base
	s    *Service
	tb   events.TxBus
	wake chan struct{}

	// once starts the loop at the first poke, or is spent by a stop so
	// that nothing starts it again.
	once sync.Once
	// interval is relayInterval, shorter in tests; gap is relayMinGap.
	interval, gap time.Duration
	// passes counts the relay passes (tests).
	passes atomic.Int64
}

func newRelay(s *Service) *relay {
	tb, ok := s.bus.(events.TxBus)
	if !ok || s.db == nil || !s.db.Caps().Outbox {
		return nil
	}
	return &relay{s: s, tb: tb, wake: make(chan struct{}, 1), interval: relayInterval, gap: relayMinGap}
}

// start runs the relay until stop; later calls do nothing.
func (r *relay) start() {
	if r == nil {
		return
	}
	r.once.Do(func() {
		ctx, _ := r.life.StartInit(context.Background())
		r.life.Go(func() { r.run(ctx) })
	})
}

// poke wakes the relay: something was written to the outbox and committed.
func (r *relay) poke() {
	if r == nil {
		return
	}
	r.start()
	select {
	case r.wake <- struct{}{}:
	default: // a wake-up is pending already; it will see this row too
	}
}

// stop ends the relay after a last pass (what has committed goes out before
// the process does) and waits for it.
func (r *relay) stop() {
	if r == nil {
		return
	}
	r.once.Do(func() {}) // never start after a stop
	r.life.Stop()
}

func (r *relay) run(ctx context.Context) {
	t := time.NewTicker(r.interval)
	defer t.Stop()
	var last time.Time // the previous pass's start
	for {
		select {
		case <-ctx.Done():
			r.lastFlush()
			return
		case <-r.wake:
		case <-t.C:
		}
		if wait := r.gap - time.Since(last); wait > 0 {
			gap := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				gap.Stop()
				r.lastFlush()
				return
			case <-gap.C:
			}
		}
		last = time.Now()
		r.flush(ctx)
	}
}

// lastFlush is the pass at stop: what has committed goes out before the
// process does.
func (r *relay) lastFlush() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r.flush(ctx)
}

// flush sends every committed outbox row, a batch at a time.
func (r *relay) flush(ctx context.Context) {
	for ctx.Err() == nil {
		r.passes.Add(1)
		n, err := r.s.db.RelayOutbox(ctx, r.tb.Channel(), relayBatch)
		if err != nil {
			if ctx.Err() == nil {
				// No caller to tell: the rows stay and the next pass
				// retries them.
				r.s.log.Error("relay event outbox", "err", err)
			}
			return
		}
		if n < relayBatch {
			return
		}
	}
}
