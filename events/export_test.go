package events

import "time"

// SetReorderWindow shortens a bus's reorder window for tests.
func (b *NATSBus) SetReorderWindow(d time.Duration) { b.track.window = d }

// NewSeqTracker exposes the gap detector with an injected clock.
func NewSeqTracker(window time.Duration, now func() time.Time) *SeqTracker {
	t := newSeqTracker(window)
	t.now = now
	return &SeqTracker{t}
}

// SeqTracker wraps seqTracker for the tests.
type SeqTracker struct{ t *seqTracker }

func (s *SeqTracker) Observe(origin string, seq uint64) []Gap { return s.t.observe(origin, seq) }
func (s *SeqTracker) Expire() []Gap                           { return s.t.expire() }
