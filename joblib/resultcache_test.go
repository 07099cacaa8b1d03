package joblib

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

type waitingCache interface {
	ResultCache
	Waiting(k ResultKey) int
}

// eachCache runs fn against both ResultCache implementations.
func eachCache(t *testing.T, fn func(t *testing.T, c waitingCache)) {
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		c := NewMemoryResultCache(ResultCacheBudget{})
		startCache(t, c)
		fn(t, c)
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		c, err := NewPGResultCache(dbtest.Open(t, models.Postgres), PGResultCacheConfig{})
		if err != nil {
			t.Fatal(err)
		}
		startCache(t, c)
		fn(t, c)
	})
}

func startCache(t *testing.T, c ResultCache) {
	t.Helper()
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
}

func key() ResultKey {
	return ResultKey{ProviderID: uuid.New(), Hash: RequestHash(map[string]string{"n": uuid.NewString()})}
}

func TestResultCacheStoreGetExpire(t *testing.T) {
	t.Parallel()
	eachCache(t, func(t *testing.T, c waitingCache) {
		ctx := t.Context()
		k := key()
		if _, ok, err := c.Get(ctx, k); err != nil || ok {
			t.Fatalf("empty cache: ok=%v err=%v", ok, err)
		}
		if err := c.Store(ctx, k, []byte("v1"), time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := c.Store(ctx, k, []byte("v2"), time.Minute); err != nil {
			t.Fatal(err)
		}
		if b, ok, err := c.Get(ctx, k); err != nil || !ok || string(b) != "v2" {
			t.Fatalf("get = %q %v %v, want v2", b, ok, err)
		}
		empty := key()
		if err := c.Store(ctx, empty, nil, time.Minute); err != nil {
			t.Fatal(err)
		}
		if b, ok, err := c.Get(ctx, empty); err != nil || !ok || len(b) != 0 {
			t.Fatalf("empty result: %q %v %v", b, ok, err)
		}
		short := key()
		if err := c.Store(ctx, short, []byte("x"), 50*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		time.Sleep(120 * time.Millisecond)
		if _, ok, _ := c.Get(ctx, short); ok {
			t.Fatal("expired result still served")
		}
	})
}

// Exactly one of many concurrent acquirers gets the lock; release and expiry
// make it available again.
func TestResultCacheInflightExactlyOnce(t *testing.T) {
	t.Parallel()
	eachCache(t, func(t *testing.T, c waitingCache) {
		ctx := t.Context()
		k := key()
		var won atomic.Int32
		var wg sync.WaitGroup
		for range 100 {
			wg.Go(func() {
				ok, err := c.AcquireInflight(ctx, k, time.Minute)
				if err != nil {
					t.Error(err)
				}
				if ok {
					won.Add(1)
				}
			})
		}
		wg.Wait()
		if won.Load() != 1 {
			t.Fatalf("%d acquirers won the inflight lock, want 1", won.Load())
		}
		if err := c.ReleaseInflight(ctx, k); err != nil {
			t.Fatal(err)
		}
		if ok, _ := c.AcquireInflight(ctx, k, 50*time.Millisecond); !ok {
			t.Fatal("released lock not acquirable")
		}
		if ok, _ := c.AcquireInflight(ctx, k, time.Minute); ok {
			t.Fatal("held lock acquired twice")
		}
		time.Sleep(120 * time.Millisecond)
		if ok, _ := c.AcquireInflight(ctx, k, time.Minute); !ok {
			t.Fatal("expired lock not acquirable")
		}
	})
}

func TestResultCacheWait(t *testing.T) {
	t.Parallel()
	eachCache(t, func(t *testing.T, c waitingCache) {
		ctx := t.Context()
		k := key()
		// nothing arrives: the wait ends at its timeout, not before
		start := time.Now()
		if _, ok, err := c.Wait(ctx, k, 150*time.Millisecond); ok || err != nil {
			t.Fatalf("wait on nothing: ok=%v err=%v", ok, err)
		}
		if d := time.Since(start); d < 150*time.Millisecond {
			t.Fatalf("wait returned after %s, before its timeout", d)
		}
		// timeout 0 checks once
		if _, ok, _ := c.Wait(ctx, k, 0); ok {
			t.Fatal("wait 0 found a result that does not exist")
		}
		// an upload wakes a waiter long before its timeout
		type res struct {
			b   []byte
			ok  bool
			err error
			at  time.Time
		}
		done := make(chan res, 1)
		go func() {
			b, ok, err := c.Wait(ctx, k, 20*time.Second)
			done <- res{b, ok, err, time.Now()}
		}()
		waitUntil(t, func() bool { return c.Waiting(k) == 1 })
		uploaded := time.Now()
		if err := c.Store(ctx, k, []byte("data"), time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := c.Notify(ctx, k); err != nil {
			t.Fatal(err)
		}
		r := <-done
		if r.err != nil || !r.ok || string(r.b) != "data" {
			t.Fatalf("woken wait = %q %v %v", r.b, r.ok, r.err)
		}
		if d := r.at.Sub(uploaded); d > 2*time.Second {
			t.Fatalf("waiter woke %s after the upload", d)
		}
		if c.Waiting(k) != 0 {
			t.Fatal("waiter still registered after returning")
		}
		// a cancelled reader returns at once
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, _, err := c.Wait(cctx, key(), 10*time.Second); err == nil {
			t.Fatal("cancelled wait returned no error")
		}
	})
}

func TestResultCachePurgeProvider(t *testing.T) {
	t.Parallel()
	eachCache(t, func(t *testing.T, c waitingCache) {
		ctx := t.Context()
		a1, other := key(), key()
		a2 := ResultKey{ProviderID: a1.ProviderID, Hash: RequestHash(map[string]string{"x": "2"})}
		for _, k := range []ResultKey{a1, a2, other} {
			if err := c.Store(ctx, k, []byte("v"), time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		if ok, _ := c.AcquireInflight(ctx, a1, time.Minute); !ok {
			t.Fatal("acquire")
		}
		if err := c.PurgeProvider(ctx, a1.ProviderID); err != nil {
			t.Fatal(err)
		}
		for _, k := range []ResultKey{a1, a2} {
			if _, ok, _ := c.Get(ctx, k); ok {
				t.Fatalf("purged provider still has %v", k)
			}
		}
		if _, ok, _ := c.Get(ctx, other); !ok {
			t.Fatal("purge removed another provider's result")
		}
		if ok, _ := c.AcquireInflight(ctx, a1, time.Minute); !ok {
			t.Fatal("purge left the inflight lock")
		}
	})
}

// Two caches on two connection pools of one PostgreSQL database are two
// nodes: a waiter on one is woken by a Notify on the other.
func TestPGResultCacheWakesAcrossNodes(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t, models.Postgres)
	open := func() *PGResultCache {
		db, err := models.Open(t.Context(), url, models.OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		if _, err := db.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
		c, err := NewPGResultCache(db, PGResultCacheConfig{})
		if err != nil {
			t.Fatal(err)
		}
		startCache(t, c)
		return c
	}
	a, b := open(), open()
	k := key()
	done := make(chan []byte, 1)
	go func() {
		body, ok, err := a.Wait(t.Context(), k, 20*time.Second)
		if err != nil || !ok {
			t.Errorf("wait: ok=%v err=%v", ok, err)
		}
		done <- body
	}()
	waitUntil(t, func() bool { return a.Waiting(k) == 1 })
	start := time.Now()
	if err := b.Store(t.Context(), k, []byte("from b"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := b.Notify(t.Context(), k); err != nil {
		t.Fatal(err)
	}
	select {
	case body := <-done:
		if string(body) != "from b" {
			t.Fatalf("got %q", body)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("cross-node wake took %s", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter on node a was not woken by node b's notify")
	}
}

func TestPGResultCacheDeleteExpired(t *testing.T) {
	t.Parallel()
	db := dbtest.Open(t, models.Postgres)
	c, err := NewPGResultCache(db, PGResultCacheConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	k := key()
	if err := c.Store(ctx, k, []byte("x"), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AcquireInflight(ctx, k, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	n, err := c.DeleteExpired(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("deleted %d rows, want 2 (one result, one lock)", n)
	}
	// the result of a provider that no longer exists goes too
	if err := c.Store(ctx, key(), []byte("orphan"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if n, err = c.DeleteExpired(ctx); err != nil || n != 1 {
		t.Fatalf("orphan sweep deleted %d (%v), want 1", n, err)
	}
}

func TestMemoryResultCacheDeleteExpired(t *testing.T) {
	t.Parallel()
	c := NewMemoryResultCache(ResultCacheBudget{})
	now := time.Now()
	c.now = func() time.Time { return now }
	ctx := t.Context()
	k := key()
	_ = c.Store(ctx, k, []byte("x"), time.Second)
	_, _ = c.AcquireInflight(ctx, k, time.Second)
	_ = c.Store(ctx, key(), []byte("y"), time.Hour)
	now = now.Add(2 * time.Second)
	if n := c.DeleteExpired(); n != 2 {
		t.Fatalf("deleted %d, want 2", n)
	}
	if c.Len() != 1 {
		t.Fatalf("%d results left, want 1", c.Len())
	}
}

func waitUntil(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(2 * time.Millisecond)
	}
}
