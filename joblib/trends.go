package joblib

import (
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/zndraw/joblib/models"
)

// TrendMinutes is how many one-minute points a Trends keeps: the last hour.
const TrendMinutes = 60

// trendSamples bounds the claim latencies one minute keeps for its
// percentiles: past it, reservoir sampling keeps a uniform sample.
const trendSamples = 512

// Trends is the dashboard's sparklines: per minute over the last hour,
// tasks completed and failed, the pending depth, claim latency (p50, p99)
// and worker cleanups by path. It is a fixed ring of TrendMinutes buckets
// (memory does not grow with traffic); a bucket older than an hour is
// reused. Safe for concurrent use.
type Trends struct {
	now func() time.Time

	mu      sync.Mutex
	buckets [TrendMinutes]trendBucket
	seen    uint64 // claims observed, for the reservoir
}

type trendBucket struct {
	minute    int64 // Unix minute; 0 for an unused bucket
	completed int64
	failed    int64
	pending   int64 // the last depth seen in the minute; -1 when none
	latencies []float64
	claims    int64
	cleanups  map[string]int64
}

// NewTrends returns an empty ring; now is the clock (time.Now when nil).
func NewTrends(now func() time.Time) *Trends {
	if now == nil {
		now = time.Now
	}
	return &Trends{now: now}
}

// bucket returns the current minute's bucket, reset if it held an older
// minute. The caller holds mu.
func (t *Trends) bucket() *trendBucket {
	m := t.now().Unix() / 60
	b := &t.buckets[m%TrendMinutes]
	if b.minute != m {
		*b = trendBucket{minute: m, pending: -1, latencies: b.latencies[:0]}
	}
	return b
}

// TaskFinished counts a task that reached completed or failed (other
// statuses are ignored).
func (t *Trends) TaskFinished(status string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch status {
	case "completed":
		t.bucket().completed++
	case "failed":
		t.bucket().failed++
	}
}

// Pending records the pending depth seen now.
func (t *Trends) Pending(n int64) {
	t.mu.Lock()
	t.bucket().pending = n
	t.mu.Unlock()
}

// Claimed records one claim's latency: from the task's submission (or
// requeue) to its claim, both by the database's clock.
func (t *Trends) Claimed(latency time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.bucket()
	b.claims++
	ms := float64(latency.Microseconds()) / 1000
	if len(b.latencies) < trendSamples {
		b.latencies = append(b.latencies, ms)
		return
	}
	// Algorithm R: the i-th claim replaces a kept one with probability
	// trendSamples/i; the index comes from a cheap counter hash.
	t.seen++
	if j := mix(t.seen) % uint64(b.claims); j < trendSamples {
		b.latencies[j] = ms
	}
}

func mix(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	return x
}

// Cleanup counts workers cleaned up by a path (sweeper, disconnect, ...).
func (t *Trends) Cleanup(path string, workers int) {
	if workers <= 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.bucket()
	if b.cleanups == nil {
		b.cleanups = map[string]int64{}
	}
	b.cleanups[path] += int64(workers)
}

// TrendSeries is the last hour, one point per minute, oldest first; the
// last point is the current (partial) minute. A null is a minute with
// nothing to show (no claim, no depth seen).
type TrendSeries struct {
	// Start is the first point's minute (UTC).
	Start      time.Time          `json:"start"`
	Completed  []int64            `json:"completed"`
	Failed     []int64            `json:"failed"`
	Pending    []*int64           `json:"pending"`
	ClaimP50Ms []*float64         `json:"claim_p50_ms"`
	ClaimP99Ms []*float64         `json:"claim_p99_ms"`
	Claims     []int64            `json:"claims"`
	Cleanups   map[string][]int64 `json:"cleanups"`
}

// Series returns the ring as series.
func (t *Trends) Series() TrendSeries {
	t.mu.Lock()
	defer t.mu.Unlock()
	end := t.now().Unix() / 60
	first := end - TrendMinutes + 1
	s := TrendSeries{
		Start:     time.Unix(first*60, 0).UTC(),
		Completed: make([]int64, TrendMinutes), Failed: make([]int64, TrendMinutes), Claims: make([]int64, TrendMinutes),
		Pending: make([]*int64, TrendMinutes), ClaimP50Ms: make([]*float64, TrendMinutes), ClaimP99Ms: make([]*float64, TrendMinutes),
		Cleanups: map[string][]int64{},
	}
	for i := range TrendMinutes {
		b := &t.buckets[(first+int64(i))%TrendMinutes]
		if b.minute != first+int64(i) {
			continue
		}
		s.Completed[i], s.Failed[i], s.Claims[i] = b.completed, b.failed, b.claims
		if b.pending >= 0 {
			s.Pending[i] = new(b.pending)
		}
		if len(b.latencies) > 0 {
			l := slices.Clone(b.latencies)
			sort.Float64s(l)
			s.ClaimP50Ms[i], s.ClaimP99Ms[i] = new(quantile(l, 0.50)), new(quantile(l, 0.99))
		}
		for path, n := range b.cleanups {
			if s.Cleanups[path] == nil {
				s.Cleanups[path] = make([]int64, TrendMinutes)
			}
			s.Cleanups[path][i] = n
		}
	}
	return s
}

// quantile is the nearest-rank q-quantile of sorted values.
func quantile(sorted []float64, q float64) float64 {
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// Trends is this process's ring of the last hour for the dashboard. The
// service records the claims it made (their latency by the database's
// clock); the server adds the rest.
func (s *Service) Trends() *Trends { return s.trends }

// recordClaims records the claim latency of freshly claimed rows.
func (s *Service) recordClaims(ts []models.Task) {
	for _, t := range ts {
		if !t.ClaimedAt.IsZero() && !t.CreatedAt.IsZero() {
			s.trends.Claimed(max(0, t.ClaimedAt.Sub(t.CreatedAt.Time)))
		}
	}
}
