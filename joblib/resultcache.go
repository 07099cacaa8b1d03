package joblib

import (
	"context"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/keywait"
	"github.com/zndraw/joblib/internal/startstop"
	"github.com/zndraw/joblib/models"
)

// ResultKey identifies one cached provider result: provider id and request hash.
type ResultKey = models.ResultKey

// ResultCache holds uploaded provider results and the inflight locks that
// coalesce dispatches (the contract's ResultBackend, §7.6). Two
// implementations: MemoryResultCache for one process (embedded SQLite) and
// models.PGResultCache for nodes sharing a PostgreSQL database.
type ResultCache interface {
	// Get returns the unexpired result of k.
	Get(ctx context.Context, k ResultKey) ([]byte, bool, error)
	// Store caches body under k for ttl. body must not be modified afterwards.
	Store(ctx context.Context, k ResultKey, body []byte, ttl time.Duration) error
	// AcquireInflight takes k's dispatch lock for ttl; exactly one of any
	// number of concurrent callers gets true until the lock is released or
	// expires.
	AcquireInflight(ctx context.Context, k ResultKey, ttl time.Duration) (bool, error)
	// ReleaseInflight drops k's dispatch lock.
	ReleaseInflight(ctx context.Context, k ResultKey) error
	// Wait returns k's result once it is stored, or nothing after timeout
	// (timeout <= 0: check once). It subscribes before it checks.
	Wait(ctx context.Context, k ResultKey, timeout time.Duration) ([]byte, bool, error)
	// Notify wakes every waiter of k (on every node).
	Notify(ctx context.Context, k ResultKey) error
	// PurgeProvider drops every result and lock of a provider.
	PurgeProvider(ctx context.Context, providerID uuid.UUID) error
	// Start begins background upkeep (expiry, listeners); Stop ends it.
	Start(ctx context.Context) error
	Stop()
}

var (
	_ ResultCache = (*MemoryResultCache)(nil)
	_ ResultCache = (*models.PGResultCache)(nil)
)

// MemoryResultCacheDefaultCleanupInterval is how often expired entries go.
const MemoryResultCacheDefaultCleanupInterval = 30 * time.Second

type memResult struct {
	body    []byte
	expires time.Time
}

// MemoryResultCache is the single-process ResultCache: maps with expiry and
// in-process wake-ups. Expired entries are invisible at once and removed by a
// sweep every CleanupInterval while started.
type MemoryResultCache struct {
	startstop.Base
	// CleanupInterval is the expiry sweep period (default 30 s). Set before Start.
	CleanupInterval time.Duration

	mu       sync.Mutex
	results  map[ResultKey]memResult
	inflight map[ResultKey]time.Time
	waiters  *keywait.Registry[ResultKey]
	now      func() time.Time
}

// NewMemoryResultCache returns an empty in-memory cache.
func NewMemoryResultCache() *MemoryResultCache {
	return &MemoryResultCache{
		results:  map[ResultKey]memResult{},
		inflight: map[ResultKey]time.Time{},
		waiters:  keywait.New[ResultKey](),
		now:      time.Now,
	}
}

// Start runs the expiry sweep in the background.
func (c *MemoryResultCache) Start(ctx context.Context) error {
	sctx, ok := c.StartInit(ctx)
	if !ok {
		return nil
	}
	interval := c.CleanupInterval
	if interval <= 0 {
		interval = MemoryResultCacheDefaultCleanupInterval
	}
	c.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
				c.DeleteExpired()
			}
		}
	})
	return nil
}

// DeleteExpired removes expired results and locks and returns how many went.
func (c *MemoryResultCache) DeleteExpired() int {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for k, r := range c.results {
		if !now.Before(r.expires) {
			delete(c.results, k)
			n++
		}
	}
	for k, exp := range c.inflight {
		if !now.Before(exp) {
			delete(c.inflight, k)
			n++
		}
	}
	return n
}

// Len is the number of stored results, expired ones included until swept.
func (c *MemoryResultCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.results)
}

// Get implements ResultCache.
func (c *MemoryResultCache) Get(_ context.Context, k ResultKey) ([]byte, bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.results[k]
	if !ok || !c.now().Before(r.expires) {
		return nil, false, nil
	}
	return r.body, true, nil
}

// Store implements ResultCache.
func (c *MemoryResultCache) Store(_ context.Context, k ResultKey, body []byte, ttl time.Duration) error {
	if body == nil {
		body = []byte{}
	}
	c.mu.Lock()
	c.results[k] = memResult{body: body, expires: c.now().Add(ttl)}
	c.mu.Unlock()
	return nil
}

// AcquireInflight implements ResultCache.
func (c *MemoryResultCache) AcquireInflight(_ context.Context, k ResultKey, ttl time.Duration) (bool, error) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if exp, held := c.inflight[k]; held && now.Before(exp) {
		return false, nil
	}
	c.inflight[k] = now.Add(ttl)
	return true, nil
}

// ReleaseInflight implements ResultCache.
func (c *MemoryResultCache) ReleaseInflight(_ context.Context, k ResultKey) error {
	c.mu.Lock()
	delete(c.inflight, k)
	c.mu.Unlock()
	return nil
}

// Inflight reports whether k's dispatch lock is held.
func (c *MemoryResultCache) Inflight(_ context.Context, k ResultKey) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	exp, held := c.inflight[k]
	return held && c.now().Before(exp), nil
}

// Wait implements ResultCache.
func (c *MemoryResultCache) Wait(ctx context.Context, k ResultKey, timeout time.Duration) ([]byte, bool, error) {
	return keywait.Wait(ctx, c.waiters, k, timeout, func(ctx context.Context) ([]byte, bool, error) { return c.Get(ctx, k) })
}

// Notify implements ResultCache.
func (c *MemoryResultCache) Notify(_ context.Context, k ResultKey) error {
	c.waiters.Wake(k)
	return nil
}

// PurgeProvider implements ResultCache.
func (c *MemoryResultCache) PurgeProvider(_ context.Context, providerID uuid.UUID) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.results {
		if k.ProviderID == providerID {
			delete(c.results, k)
		}
	}
	for k := range c.inflight {
		if k.ProviderID == providerID {
			delete(c.inflight, k)
		}
	}
	return nil
}

// Waiting is the number of readers of k waiting (tests, metrics).
func (c *MemoryResultCache) Waiting(k ResultKey) int { return c.waiters.Waiting(k) }
