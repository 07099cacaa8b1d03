package keywait

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// A change that lands between the subscription and the first check is seen
// by the check; one that lands during the wait wakes it.
func TestWaitSeesChangesAroundTheCheck(t *testing.T) {
	t.Parallel()
	r := New[string]()
	var v atomic.Value
	v.Store("")
	check := func(context.Context) (string, bool, error) {
		s := v.Load().(string)
		return s, s != "", nil
	}
	done := make(chan string, 1)
	go func() {
		s, ok, err := Wait(t.Context(), r, "k", 10*time.Second, check)
		if !ok || err != nil {
			t.Errorf("ok=%v err=%v", ok, err)
		}
		done <- s
	}()
	for r.Waiting("k") == 0 {
		time.Sleep(time.Millisecond)
	}
	r.Wake("other") // another key's change does not end the wait
	v.Store("set")
	r.Wake("k")
	select {
	case s := <-done:
		if s != "set" {
			t.Fatalf("got %q", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wake did not end the wait")
	}
	if r.Waiting("k") != 0 {
		t.Fatal("waiter left registered")
	}
	// timeout: a final check still finds a value set without a wake-up
	v.Store("")
	go func() { time.Sleep(50 * time.Millisecond); v.Store("late") }()
	if s, ok, _ := Wait(t.Context(), r, "k", 200*time.Millisecond, check); !ok || s != "late" {
		t.Fatalf("final check: %q %v", s, ok)
	}
}
