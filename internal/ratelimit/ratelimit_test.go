package ratelimit

import (
	"testing"
	"time"
)

func TestLimiter(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	l := New[string](2, 3).WithClock(func() time.Time { return now })
	for i := range 3 {
		if ok, _ := l.Allow("a"); !ok {
			t.Fatalf("burst token %d refused", i)
		}
	}
	ok, wait := l.Allow("a")
	if ok || wait != 500*time.Millisecond {
		t.Fatalf("past the burst: ok=%v wait=%s, want refused for 500ms", ok, wait)
	}
	if ok, _ := l.Allow("b"); !ok {
		t.Fatal("another key is limited by a's use")
	}
	now = now.Add(500 * time.Millisecond)
	if ok, _ := l.Allow("a"); !ok {
		t.Fatal("no token after the refill time")
	}
	if ok, _ := l.Allow("a"); ok {
		t.Fatal("two tokens from half a second at 2/s")
	}
	// Memory stays bounded however many keys come by.
	for i := range 3 * maxKeys {
		now = now.Add(time.Second)
		l.Allow(string(rune(i)))
	}
	if l.Len() > maxKeys {
		t.Fatalf("%d buckets kept", l.Len())
	}
	// Ready looks without taking.
	r := New[string](1, 1).WithClock(func() time.Time { return now })
	for range 3 {
		if ok, _ := r.Ready("k"); !ok {
			t.Fatal("Ready took the token")
		}
	}
	r.Allow("k")
	if ok, wait := r.Ready("k"); ok || wait != time.Second {
		t.Fatalf("empty bucket: ready=%v wait=%s", ok, wait)
	}
	now = now.Add(time.Second)
	if ok, _ := r.Ready("k"); !ok {
		t.Fatal("not ready after the refill time")
	}
	var off *Limiter[string]
	if ok, _ := off.Allow("x"); !ok {
		t.Fatal("a nil limiter refused")
	}
	if ok, _ := New[string](0, 1).Allow("x"); !ok {
		t.Fatal("a disabled limiter refused")
	}
}
