package joblib_test

import (
	"testing"
	"time"

	"github.com/zndraw/joblib/joblib"
)

// TestTrendsRing: counts land in the current minute's point, the series is
// the last hour oldest first, a minute older than an hour is forgotten (its
// bucket reused), percentiles are nearest-rank, and a busy minute keeps a
// bounded sample.
func TestTrendsRing(t *testing.T) {
	now := time.Date(2026, 11, 27, 10, 0, 30, 0, time.UTC)
	tr := joblib.NewTrends(func() time.Time { return now })
	last := joblib.TrendMinutes - 1

	tr.TaskFinished("completed")
	tr.TaskFinished("completed")
	tr.TaskFinished("failed")
	tr.TaskFinished("running") // ignored
	tr.Pending(7)
	for i := 1; i <= 100; i++ {
		tr.Claimed(time.Duration(i) * time.Millisecond)
	}
	tr.Cleanup("sweeper", 2)
	tr.Cleanup("graceful", 0) // nothing cleaned: no series
	s := tr.Series()
	if !s.Start.Equal(time.Date(2026, 11, 27, 9, 1, 0, 0, time.UTC)) {
		t.Fatalf("start %s", s.Start)
	}
	if s.Completed[last] != 2 || s.Failed[last] != 1 || *s.Pending[last] != 7 || s.Claims[last] != 100 {
		t.Fatalf("current minute: completed %d failed %d pending %d claims %d", s.Completed[last], s.Failed[last], *s.Pending[last], s.Claims[last])
	}
	if *s.ClaimP50Ms[last] != 50 || *s.ClaimP99Ms[last] != 99 {
		t.Fatalf("p50 %v p99 %v, want 50 and 99", *s.ClaimP50Ms[last], *s.ClaimP99Ms[last])
	}
	if len(s.Cleanups) != 1 || s.Cleanups["sweeper"][last] != 2 {
		t.Fatalf("cleanups %v", s.Cleanups)
	}
	if s.Pending[last-1] != nil || s.ClaimP50Ms[last-1] != nil || s.Completed[last-1] != 0 {
		t.Fatal("an empty minute shows values")
	}

	// Ten minutes later the point moved left by ten.
	now = now.Add(10 * time.Minute)
	tr.TaskFinished("completed")
	s = tr.Series()
	if s.Completed[last-10] != 2 || s.Completed[last] != 1 || s.Failed[last-10] != 1 {
		t.Fatalf("after 10 min: %v", s.Completed)
	}

	// An hour after the first minute, it is gone and its bucket reused.
	now = now.Add(50 * time.Minute)
	tr.TaskFinished("failed")
	s = tr.Series()
	var total int64
	for _, n := range s.Completed {
		total += n
	}
	if total != 1 || s.Failed[last] != 1 || s.Claims[last] != 0 || s.Cleanups["sweeper"] != nil {
		t.Fatalf("after an hour: completed %v failed %v cleanups %v", s.Completed, s.Failed, s.Cleanups)
	}
	for _, series := range [][]int64{s.Completed, s.Failed, s.Claims} {
		if len(series) != joblib.TrendMinutes {
			t.Fatalf("series of %d points", len(series))
		}
	}

	// A busy minute: 100 000 claims, a bounded sample whose percentiles
	// are still those of the whole.
	now = now.Add(time.Minute)
	for i := range 100000 {
		tr.Claimed(time.Duration(i%1000) * time.Millisecond)
	}
	s = tr.Series()
	if s.Claims[last] != 100000 {
		t.Fatalf("claims %d", s.Claims[last])
	}
	if p := *s.ClaimP50Ms[last]; p < 400 || p > 600 {
		t.Fatalf("sampled p50 %v, want about 500", p)
	}
	if p := *s.ClaimP99Ms[last]; p < 950 {
		t.Fatalf("sampled p99 %v, want about 990", p)
	}
}
