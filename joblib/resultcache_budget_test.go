package joblib

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/internal/limits"
	"github.com/zndraw/joblib/models"
)

// eachBudgetedCache runs fn against both caches held to budget.
func eachBudgetedCache(t *testing.T, budget ResultCacheBudget, fn func(t *testing.T, c ResultCache)) {
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		c := NewMemoryResultCache(budget)
		startCache(t, c)
		fn(t, c)
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		c, err := NewPGResultCache(dbtest.Open(t, models.Postgres), PGResultCacheConfig{Budget: budget})
		if err != nil {
			t.Fatal(err)
		}
		startCache(t, c)
		fn(t, c)
	})
}

func has(t *testing.T, c ResultCache, k ResultKey) bool {
	t.Helper()
	_, ok, err := c.Get(context.Background(), k)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// The result cache holds to its budget: one provider never takes more than
// its share (its own least recently used results go first, a read counts as
// a use), the whole cache never more than its caps, another provider's
// results survive one provider's flood, and a result larger than a share is
// refused with 413 provider_result_bytes.
func TestResultCacheBudget(t *testing.T) {
	t.Parallel()
	budget := ResultCacheBudget{MaxBytes: 1000, MaxEntries: 8, ProviderShare: 0.5}
	eachBudgetedCache(t, budget, func(t *testing.T, c ResultCache) {
		ctx := t.Context()
		a, b := uuid.New(), uuid.New()
		k := func(p uuid.UUID, i int) ResultKey { return ResultKey{ProviderID: p, Hash: fmt.Sprintf("%064d", i)} }
		body := bytes.Repeat([]byte("x"), 100)
		store := func(key ResultKey, n int) {
			t.Helper()
			if err := c.Store(ctx, key, body[:n], time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		usage := func() (int64, int64) {
			t.Helper()
			by, n, err := c.Usage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return by, n
		}
		// B stores two results that A's flood must not touch.
		store(k(b, 0), 100)
		store(k(b, 1), 100)
		// A: 4 entries of 100 bytes is its share of entries (8 × 0.5).
		for i := range 4 {
			store(k(a, i), 100)
		}
		if !has(t, c, k(a, 0)) { // a read makes a0 the most recent
			t.Fatal("a0 missing before A exceeded its share")
		}
		for i := 4; i < 40; i++ {
			store(k(a, i), 100)
			by, n := usage()
			if by > budget.MaxBytes || n > budget.MaxEntries {
				t.Fatalf("after store %d: %d bytes, %d entries", i, by, n)
			}
		}
		if !has(t, c, k(b, 0)) || !has(t, c, k(b, 1)) {
			t.Fatal("provider A's flood evicted provider B's results")
		}
		for i := 36; i < 40; i++ {
			if !has(t, c, k(a, i)) {
				t.Fatalf("a%d (among A's four most recent) was evicted", i)
			}
		}
		if has(t, c, k(a, 0)) || has(t, c, k(a, 35)) {
			t.Fatal("A holds more than its share")
		}
		// B's two results and A's four.
		if by, n := usage(); by != 600 || n != 6 {
			t.Fatalf("usage %d bytes %d entries, want 600 and 6", by, n)
		}
		// Larger than a provider's share: refused, nothing stored.
		err := c.Store(ctx, k(b, 9), bytes.Repeat([]byte("y"), 501), time.Minute)
		if e, ok := AsError(err); !ok || e.Code != CodePayloadTooLarge || e.Limit != limits.ProviderResultBytes {
			t.Fatalf("oversized store: %v", err)
		}
		if has(t, c, k(b, 9)) {
			t.Fatal("an oversized result was stored")
		}
		// The total cap: a third provider fills its share, the globally
		// least recently used results go.
		cc := uuid.New()
		for i := range 4 {
			store(k(cc, i), 100)
		}
		if by, n := usage(); by > budget.MaxBytes || n > budget.MaxEntries {
			t.Fatalf("usage %d bytes %d entries past the caps", by, n)
		}
		for i := range 4 {
			if !has(t, c, k(cc, i)) {
				t.Fatalf("c%d evicted although the newest", i)
			}
		}
	})
}
