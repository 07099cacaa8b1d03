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
//
// A pass sends every committed row, whichever node wrote it, so a node whose
// rows another node's relay already sent need not run one. The hot
// statements write their rows under a frame whose id comes back to this
// node's listener with them (events.PGBus.OnEcho): the relay keeps the frame
// ids it was woken for until they come back or until a pass of its own that
// began after the wake succeeds, and a wake finds nothing to do once all of
// them came back. A wake that names no frame (the general path's rows)
// always runs a pass.
//
// The busy relays of a deployment share one gap (see nextGap): a node
// spaces its passes from the last pass it heard, of any node
// (events.PGBus.LastHeard), and a pass that finds another relay holding the
// lock sends nothing and does not queue behind it (the other pass carries
// the rows committed before it began, whose frames then come back); the
// node tries again a gap later if anything is still owed. Before, each of N
// busy nodes ran its own pass per gap, most of them waiting for the lock and
// then finding the rows already sent: 2.4 passes per task at three nodes
// (BENCHMARKS.md).

// relayInterval is how often the relay looks for rows nobody was woken for.
const relayInterval = time.Second

// relayBatch is the most rows one relay transaction sends.
const relayBatch = 500

// relayMinGap and relayMaxGap bound the spacing of a busy relay's passes.
// A pass costs PostgreSQL a transaction (the relay lock, the DELETE, a
// commit that wakes the listener of every node) whether it carries one
// event or fifty, and a relay woken after every commit ran back to back
// under load with one or two events per pass: 2.3 passes per task in the
// contract flow. A wake within the gap of the previous pass's start waits
// for the rest of it, so a pass carries what several commits wrote.
//
// The gap follows the load (nextGap): it starts at relayMinGap, doubles
// each time a wake comes inside it (commits arrive faster than passes), up
// to relayMaxGap, and falls back to relayMinGap after relayMaxGap without a
// pass. Under sustained load an event therefore waits up to relayMaxGap
// before it leaves, and the relay runs about one pass per relayMaxGap
// whatever the commit rate; a wake after a quiet spell runs at once, and a
// light load keeps the short gap. With a fixed 3 ms gap the relay ran 0.8
// passes per task; at 12 ms PostgreSQL spends about a fifth less per task in
// the contract flow, and the process too (BENCHMARKS.md, sixth round).
const (
	relayMinGap = 3 * time.Millisecond
	relayMaxGap = 12 * time.Millisecond
)

// nextGap is the gap a relay keeps for a wake that came idle after the
// last pass it knows of (its own or another node's), with the gap cur in
// force and the bounds lo and hi: a wake inside the gap is load, and the
// gap doubles, up to hi; a wake after hi or more of quiet brings it back to
// lo; otherwise it stays.
func nextGap(cur, idle, lo, hi time.Duration) time.Duration {
	switch {
	case idle >= hi:
		return lo
	case idle < cur:
		return min(2*cur, hi)
	}
	return cur
}

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
	// interval is relayInterval, shorter in tests; minGap and maxGap bound
	// the spacing of passes (relayMinGap, relayMaxGap; see nextGap).
	interval, minGap, maxGap time.Duration
	// passes counts the relay passes (tests).
	passes atomic.Int64

	mu sync.Mutex
	// owed maps each frame id this node was woken for, and has not seen
	// come back, to the wake's generation (gen when it was added).
	owed map[uint64]uint64
	gen  uint64
	// blind: a wake named no frame since the last pass began.
	blind bool

	// heard, when the bus tells it, is when this node last heard a relay
	// pass of any node (events.PGBus.LastHeard).
	heard func() time.Time
}

func newRelay(s *Service) *relay {
	tb, ok := s.bus.(events.TxBus)
	if !ok || s.db == nil || !s.db.Caps().Outbox {
		return nil
	}
	r := &relay{s: s, tb: tb, wake: make(chan struct{}, 1), interval: relayInterval, minGap: relayMinGap, maxGap: relayMaxGap, owed: map[uint64]uint64{}}
	if e, ok := tb.(interface{ OnEcho(func(uint64)) }); ok {
		e.OnEcho(r.echo)
	}
	if h, ok := tb.(interface{ LastHeard() time.Time }); ok {
		r.heard = h.LastHeard
	}
	return r
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
// The next pass runs whatever has come back meanwhile.
func (r *relay) poke() {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.blind = true
	r.mu.Unlock()
	r.wakeUp()
}

// pokeFrames wakes the relay for rows written and committed under the
// frames of the given ids (see the relay's comment). Without ids it is
// poke.
func (r *relay) pokeFrames(frames ...uint64) {
	if r == nil {
		return
	}
	if len(frames) == 0 {
		r.poke()
		return
	}
	r.mu.Lock()
	r.gen++
	for _, f := range frames {
		r.owed[f] = r.gen
	}
	r.mu.Unlock()
	r.wakeUp()
}

// echo is told that the rows of a frame of this node were sent.
func (r *relay) echo(frame uint64) {
	r.mu.Lock()
	delete(r.owed, frame)
	r.mu.Unlock()
}

// due reports whether a pass has anything to do for the wakes so far, the
// generation of the last of them, and whether one of them named no frame. A
// pass that succeeds settles them (settle); one that found another relay at
// work leaves them (busy).
func (r *relay) due() (due bool, gen uint64, blind bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	blind = r.blind
	r.blind = false
	return blind || len(r.owed) > 0, r.gen, blind
}

// busy is told that a pass found another node's relay at work and sent
// nothing. That pass sends the rows committed before it began, and their
// frames come back; the wakes stay owed, and blind ones blind, for a retry
// a gap later, which runs only if something is still owed then.
func (r *relay) busy(blind bool) {
	r.mu.Lock()
	r.blind = r.blind || blind
	r.mu.Unlock()
	r.wakeUp()
}

// settle forgets the frames of wakes up to generation gen: a pass that
// began after them and succeeded sent their rows, or found them sent. A
// pass that failed leaves them, and the next wake runs a pass again.
func (r *relay) settle(ok bool, gen uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !ok {
		r.blind = true
		return
	}
	for f, g := range r.owed {
		if g <= gen {
			delete(r.owed, f)
		}
	}
}

func (r *relay) wakeUp() {
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
	var last time.Time // the previous pass's start, on this node
	gap := r.minGap    // the spacing in force (nextGap)
	for {
		tick := false
		select {
		case <-ctx.Done():
			r.lastFlush()
			return
		case <-r.wake:
		case <-t.C:
			tick = true
		}
		since := last
		if r.heard != nil {
			// A pass of another node counts as much as one of ours:
			// the deployment's busy relays share one gap.
			if h := r.heard(); h.After(since) {
				since = h
			}
		}
		idle := time.Since(since)
		gap = nextGap(gap, idle, r.minGap, r.maxGap)
		if wait := gap - idle; wait > 0 {
			timer := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				timer.Stop()
				r.lastFlush()
				return
			case <-timer.C:
			}
		}
		due, gen, blind := r.due()
		if !due && !tick {
			continue // everything this node was woken for has come back
		}
		last = time.Now()
		ok, busy := r.flush(ctx, false)
		if busy {
			if due {
				r.busy(blind)
			}
			continue
		}
		r.settle(ok, gen)
	}
}

// lastFlush is the pass at stop: what has committed goes out before the
// process does.
func (r *relay) lastFlush() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r.flush(ctx, true)
}

// flush sends every committed outbox row, a batch at a time. It reports
// whether it got to the end, and, unless wait, whether it found another
// relay at work and sent nothing (busy: the relay lock was taken).
func (r *relay) flush(ctx context.Context, wait bool) (ok, busy bool) {
	for ctx.Err() == nil {
		r.passes.Add(1)
		n, busy, err := r.s.db.RelayOutbox(ctx, r.tb.Channel(), relayBatch, wait)
		if err != nil {
			if ctx.Err() == nil {
				// No caller to tell: the rows stay and the next pass
				// retries them.
				r.s.log.Error("relay event outbox", "err", err)
			}
			return false, false
		}
		if busy {
			// A batch after the first found the lock taken: the
			// other relay sends the rest.
			return false, true
		}
		if n < relayBatch {
			return true, false
		}
	}
	return false, false
}
