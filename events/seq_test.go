package events_test

import (
	"testing"
	"time"

	"github.com/zndraw/joblib/events"
)

// The gap detector tolerates reordering within the window, reports numbers
// still missing after it, ignores duplicates and unsequenced batches, and
// keeps origins apart.
func TestSeqTrackerGaps(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	tr := events.NewSeqTracker(2*time.Second, func() time.Time { return now })
	missing := func(gs []events.Gap) uint64 {
		var n uint64
		for _, g := range gs {
			if g.Reason != events.GapSequence {
				t.Fatalf("reason %q", g.Reason)
			}
			n += g.Missing
		}
		return n
	}
	for _, s := range []uint64{7, 8, 0, 9} { // first contact at 7: no gap
		if g := tr.Observe("a", s); len(g) != 0 {
			t.Fatalf("in order: %+v", g)
		}
	}
	if g := tr.Observe("a", 11); len(g) != 0 { // 10 missing: wait
		t.Fatalf("reordered: %+v", g)
	}
	now = now.Add(time.Second)
	if g := tr.Observe("a", 10); len(g) != 0 { // late, within the window
		t.Fatalf("late arrival: %+v", g)
	}
	if g := tr.Observe("a", 10); len(g) != 0 { // duplicate
		t.Fatalf("duplicate: %+v", g)
	}
	if g := tr.Observe("b", 1); len(g) != 0 {
		t.Fatalf("other origin: %+v", g)
	}
	if g := tr.Observe("a", 15); len(g) != 0 { // 12, 13, 14 missing
		t.Fatalf("gap reported before the window: %+v", g)
	}
	now = now.Add(time.Second)
	if g := tr.Observe("a", 13); len(g) != 0 {
		t.Fatalf("late arrival: %+v", g)
	}
	now = now.Add(1500 * time.Millisecond)
	g := tr.Expire()
	if missing(g) != 2 || g[0].Origin != "a" {
		t.Fatalf("expired gaps %+v, want 2 of origin a", g)
	}
	if g := tr.Expire(); len(g) != 0 {
		t.Fatalf("gap reported twice: %+v", g)
	}
	if g := tr.Observe("a", 1_000_000); missing(g) != 1_000_000-16 {
		t.Fatalf("big jump: %+v", g)
	}
}
