package startstop

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Concurrent Stops all return only after the service's goroutines exited;
// the service can start again afterwards.
func TestConcurrentStopWaits(t *testing.T) {
	t.Parallel()
	var b Base
	b.Stop() // before Start: a no-op
	for round := range 3 {
		ctx, ok := b.StartInit(t.Context())
		if !ok {
			t.Fatalf("round %d: StartInit refused", round)
		}
		if _, again := b.StartInit(t.Context()); again {
			t.Fatal("a running service started twice")
		}
		var exited atomic.Bool
		b.Go(func() {
			<-ctx.Done()
			if !errors.Is(context.Cause(ctx), ErrStop) {
				t.Errorf("cause %v, want ErrStop", context.Cause(ctx))
			}
			time.Sleep(20 * time.Millisecond)
			exited.Store(true)
		})
		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() {
				b.Stop()
				if !exited.Load() {
					t.Error("Stop returned before the goroutine exited")
				}
			})
		}
		wg.Wait()
		select {
		case <-b.Stopped():
		default:
			t.Fatal("Stopped not closed after Stop")
		}
	}
}
