// Package ratelimit is a keyed token bucket: each key (a user) may take
// Burst tokens at once and gets Rate tokens back per second. State is in
// memory, per process: with several nodes a user's budget is per node.
package ratelimit

import (
	"math"
	"sync"
	"time"
)

// maxKeys is how many buckets are kept before full (idle) ones are dropped;
// a dropped bucket is indistinguishable from a new one, so this bounds
// memory without changing any answer.
const maxKeys = 4096

type bucket struct {
	tokens float64
	at     time.Time
}

// Limiter is a set of token buckets by key. A nil *Limiter or one with Rate
// <= 0 allows everything. Safe for concurrent use.
type Limiter[K comparable] struct {
	rate  float64 // tokens per second
	burst float64
	now   func() time.Time

	mu      sync.Mutex
	buckets map[K]*bucket
}

// New returns a limiter of rate tokens per second and bursts of burst
// (at least 1). rate <= 0 disables it.
func New[K comparable](rate float64, burst int) *Limiter[K] {
	return &Limiter[K]{rate: rate, burst: math.Max(1, float64(burst)), now: time.Now, buckets: map[K]*bucket{}}
}

// WithClock replaces the clock (tests).
func (l *Limiter[K]) WithClock(now func() time.Time) *Limiter[K] {
	l.now = now
	return l
}

// Allow takes one token of key's bucket. When none is left it reports false
// and how long until one is.
func (l *Limiter[K]) Allow(key K) (bool, time.Duration) { return l.take(key, true) }

// Ready reports whether key's bucket holds a token, without taking it, and
// otherwise how long until it does: for a budget charged only when the
// operation turns out to cost (Allow afterwards).
func (l *Limiter[K]) Ready(key K) (bool, time.Duration) { return l.take(key, false) }

func (l *Limiter[K]) take(key K, spend bool) (bool, time.Duration) {
	if l == nil || l.rate <= 0 {
		return true, 0
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[key]
	if b == nil {
		if !spend {
			return true, 0
		}
		if len(l.buckets) >= maxKeys {
			l.dropFull(now)
		}
		b = &bucket{tokens: l.burst, at: now}
		l.buckets[key] = b
	}
	if el := now.Sub(b.at).Seconds(); el > 0 {
		b.tokens = math.Min(l.burst, b.tokens+el*l.rate)
		b.at = now
	}
	if b.tokens >= 1 {
		if spend {
			b.tokens--
		}
		return true, 0
	}
	wait := time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
	return false, max(wait, time.Millisecond)
}

// dropFull forgets buckets that have refilled; l.mu is held.
func (l *Limiter[K]) dropFull(now time.Time) {
	for k, b := range l.buckets {
		if b.tokens+now.Sub(b.at).Seconds()*l.rate >= l.burst {
			delete(l.buckets, k)
		}
	}
}

// Len is the number of buckets kept (tests).
func (l *Limiter[K]) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}
