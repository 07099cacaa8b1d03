package events

import (
	"sync"
	"time"
)

// Gap reasons.
const (
	// GapSequence: a node's sequence numbers skipped and the missing
	// batches did not arrive within the reorder window.
	GapSequence = "sequence"
	// GapReconnect: the listener lost its connection; whatever was
	// published meanwhile was not received.
	GapReconnect = "reconnect"
)

// GapReasons lists every gap reason (metrics pre-create their series).
var GapReasons = []string{GapSequence, GapReconnect}

// Gap reports that a multi-node bus may have missed emissions of other
// nodes. The state is always in the database: receivers answer a gap by
// telling their clients to refetch (invalidations) and by waking long-poll
// waiters to re-read their rows.
type Gap struct {
	Reason string
	// Origin is the publishing node run (sequence gaps).
	Origin string
	// Missing is how many batches are missing (sequence gaps).
	Missing uint64
}

// Monitor carries a multi-node bus's health signals to observers: gaps and
// the delivery lag of received batches (by the publisher's clock: compare
// nodes whose clocks are synchronised).
type Monitor struct {
	mu   sync.RWMutex
	gaps []func(Gap)
	lags []func(time.Duration)
}

// OnGap registers fn for every detected gap. It must not block.
func (m *Monitor) OnGap(fn func(Gap)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gaps = append(m.gaps, fn)
}

// OnLag registers fn for the lag of every received batch. It must not block.
func (m *Monitor) OnLag(fn func(time.Duration)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lags = append(m.lags, fn)
}

func (m *Monitor) gap(g Gap) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, fn := range m.gaps {
		fn(g)
	}
}

func (m *Monitor) lag(d time.Duration) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, fn := range m.lags {
		fn(d)
	}
}

// Monitored is a bus that reports gaps and lag (the multi-node buses).
type Monitored interface {
	Monitor() *Monitor
}

// sequencer numbers this node's published batches 1, 2, 3, ...
type sequencer struct {
	mu  sync.Mutex
	seq uint64
}

func (s *sequencer) next() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	return s.seq
}

// maxTracked bounds the missing sequence numbers remembered per origin; a
// larger jump is reported as a gap at once.
const maxTracked = 4096

// originTTL is how long an origin that sent nothing is remembered.
const originTTL = 10 * time.Minute

// seqTracker detects gaps in the sequence numbers of each origin node run.
// Batches may arrive out of order (on PostgreSQL, transactions that took
// their numbers in one order may commit in the other), so a missing number
// is a gap only when it has not arrived within the reorder window.
type seqTracker struct {
	window time.Duration
	now    func() time.Time

	mu      sync.Mutex
	origins map[string]*originSeq
}

type originSeq struct {
	next    uint64
	missing map[uint64]time.Time // seq -> deadline
	seen    time.Time
}

func newSeqTracker(window time.Duration) *seqTracker {
	return &seqTracker{window: window, now: time.Now, origins: map[string]*originSeq{}}
}

// observe records seq from origin (0 = unsequenced) and returns the gaps
// that are certain now.
func (t *seqTracker) observe(origin string, seq uint64) []Gap {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if seq != 0 {
		st := t.origins[origin]
		switch {
		case st == nil:
			// First batch seen from this run: nothing to compare with.
			t.origins[origin] = &originSeq{next: seq + 1, missing: map[uint64]time.Time{}, seen: now}
		case seq == st.next:
			st.next++
		case seq > st.next:
			if seq-st.next > maxTracked || len(st.missing) > maxTracked {
				n := seq - st.next
				st.next = seq + 1
				st.seen = now
				return append(t.expireLocked(now), Gap{Reason: GapSequence, Origin: origin, Missing: n})
			}
			for s := st.next; s < seq; s++ {
				st.missing[s] = now.Add(t.window)
			}
			st.next = seq + 1
		default:
			delete(st.missing, seq) // late (reordered) or duplicate
		}
		if st := t.origins[origin]; st != nil {
			st.seen = now
		}
	}
	return t.expireLocked(now)
}

// expire returns the gaps whose reorder window has passed.
func (t *seqTracker) expire() []Gap {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.expireLocked(now)
}

func (t *seqTracker) expireLocked(now time.Time) []Gap {
	var gaps []Gap
	for origin, st := range t.origins {
		var n uint64
		for s, dl := range st.missing {
			if now.After(dl) {
				delete(st.missing, s)
				n++
			}
		}
		if n > 0 {
			gaps = append(gaps, Gap{Reason: GapSequence, Origin: origin, Missing: n})
		}
		if len(st.missing) == 0 && now.Sub(st.seen) > originTTL {
			delete(t.origins, origin)
		}
	}
	return gaps
}

// reset forgets every origin (after a reconnect, which is reported as a
// gap of its own: the numbers that follow cannot be compared).
func (t *seqTracker) reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	clear(t.origins)
}
