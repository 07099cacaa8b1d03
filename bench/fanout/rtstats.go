package main

import (
	"fmt"
	"math"
	"runtime/metrics"
	"time"
)

// rtStats is a snapshot of the Go runtime's scheduler and GC counters, so
// that a phase (the broadcasts) can be described by the difference of two
// snapshots: how long goroutines waited to run once runnable, how many GC
// cycles ran and how long the world was stopped.
type rtStats struct {
	sched  *metrics.Float64Histogram
	gcs    uint64
	pauses *metrics.Float64Histogram
}

var rtSamples = []string{"/sched/latencies:seconds", "/gc/cycles/total:gc-cycles", "/sched/pauses/total/gc:seconds"}

func readRT() rtStats {
	s := make([]metrics.Sample, len(rtSamples))
	for i, n := range rtSamples {
		s[i].Name = n
	}
	metrics.Read(s)
	out := rtStats{}
	if s[0].Value.Kind() == metrics.KindFloat64Histogram {
		out.sched = cloneHist(s[0].Value.Float64Histogram())
	}
	if s[1].Value.Kind() == metrics.KindUint64 {
		out.gcs = s[1].Value.Uint64()
	}
	if s[2].Value.Kind() == metrics.KindFloat64Histogram {
		out.pauses = cloneHist(s[2].Value.Float64Histogram())
	}
	return out
}

func cloneHist(h *metrics.Float64Histogram) *metrics.Float64Histogram {
	return &metrics.Float64Histogram{Counts: append([]uint64(nil), h.Counts...), Buckets: append([]float64(nil), h.Buckets...)}
}

// rtDelta describes what happened between two snapshots.
type rtDelta struct {
	SchedP50, SchedP99, SchedMax time.Duration // runnable → running
	Wakeups                      uint64        // goroutines that became runnable
	GCs                          uint64
	GCPause                      time.Duration // total stop-the-world time
}

func (a rtStats) delta(b rtStats) rtDelta {
	d := rtDelta{GCs: b.gcs - a.gcs}
	if a.sched != nil && b.sched != nil {
		counts := make([]uint64, len(b.sched.Counts))
		for i := range counts {
			counts[i] = b.sched.Counts[i] - a.sched.Counts[i]
			d.Wakeups += counts[i]
		}
		d.SchedP50 = histQuantile(counts, b.sched.Buckets, 0.50)
		d.SchedP99 = histQuantile(counts, b.sched.Buckets, 0.99)
		d.SchedMax = histQuantile(counts, b.sched.Buckets, 1)
	}
	if a.pauses != nil && b.pauses != nil {
		for i := range b.pauses.Counts {
			n := b.pauses.Counts[i] - a.pauses.Counts[i]
			lo := b.pauses.Buckets[i]
			if math.IsInf(lo, -1) || lo < 0 {
				lo = 0
			}
			d.GCPause += time.Duration(float64(n) * lo * 1e9)
		}
	}
	return d
}

// histQuantile returns the lower bound of the bucket holding quantile q.
func histQuantile(counts []uint64, buckets []float64, q float64) time.Duration {
	var total uint64
	for _, c := range counts {
		total += c
	}
	if total == 0 {
		return 0
	}
	want := uint64(math.Ceil(q * float64(total)))
	var seen uint64
	for i, c := range counts {
		seen += c
		if seen >= want && c > 0 {
			lo := buckets[i]
			if math.IsInf(lo, -1) || lo < 0 {
				lo = 0
			}
			return time.Duration(lo * 1e9)
		}
	}
	return 0
}

func (d rtDelta) String() string {
	return fmt.Sprintf("sched wait p50 %v p99 %v max %v over %d wake-ups, %d GC (%v paused)",
		d.SchedP50.Round(time.Microsecond), d.SchedP99.Round(time.Microsecond), d.SchedMax.Round(time.Microsecond), d.Wakeups, d.GCs, d.GCPause.Round(time.Microsecond))
}
