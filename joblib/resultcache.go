package joblib

import (
	"container/list"
	"context"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/keywait"
	"github.com/zndraw/joblib/internal/limits"
	"github.com/zndraw/joblib/internal/startstop"
	"github.com/zndraw/joblib/models"
)

// ResultKey identifies one cached provider result: provider id and request hash.
type ResultKey = models.ResultKey

// ResultCache holds uploaded provider results and the inflight locks that
// coalesce dispatches (the contract's ResultBackend, §7.6). Two
// implementations: MemoryResultCache for one process (embedded SQLite) and
// PGResultCache for nodes sharing a PostgreSQL database. Both hold to a
// ResultCacheBudget: a store past it evicts the least recently used results
// (first of the same provider, then of all), and a result larger than one
// provider's share is refused.
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
	// Usage is the cached results' total size in bytes and their number.
	Usage(ctx context.Context) (bytes, entries int64, err error)
	// Start begins background upkeep (expiry, listeners); Stop ends it.
	Start(ctx context.Context) error
	Stop()
}

var (
	_ ResultCache = (*MemoryResultCache)(nil)
	_ ResultCache = (*PGResultCache)(nil)
)

// ResultCacheBudget bounds a provider result cache. Zero fields are
// unbounded.
type ResultCacheBudget struct {
	// MaxBytes caps the cached bodies' total size.
	MaxBytes int64
	// MaxEntries caps the number of cached results.
	MaxEntries int64
	// ProviderShare is the fraction (0 < share <= 1) of MaxBytes and
	// MaxEntries one provider may hold; 0 means 1.
	ProviderShare float64
}

func (b ResultCacheBudget) share(total int64) int64 {
	if total <= 0 || b.ProviderShare <= 0 || b.ProviderShare >= 1 {
		return total
	}
	return max(1, int64(float64(total)*b.ProviderShare))
}

// ProviderMaxBytes is the most one provider's results may take together.
func (b ResultCacheBudget) ProviderMaxBytes() int64 { return b.share(b.MaxBytes) }

// ProviderMaxEntries is the most results one provider may have cached.
func (b ResultCacheBudget) ProviderMaxEntries() int64 { return b.share(b.MaxEntries) }

// admit refuses a body larger than one provider's share.
func (b ResultCacheBudget) admit(n int) error {
	if pm := b.ProviderMaxBytes(); pm > 0 && int64(n) > pm {
		return limitErr(CodePayloadTooLarge, limits.ProviderResultBytes, 0,
			"provider result of %d bytes exceeds a provider's share of the result cache (%d bytes)", n, pm)
	}
	return nil
}

func (b ResultCacheBudget) models() models.ResultBudget {
	return models.ResultBudget{MaxBytes: b.MaxBytes, MaxEntries: b.MaxEntries,
		ProviderMaxBytes: b.ProviderMaxBytes(), ProviderMaxEntries: b.ProviderMaxEntries()}
}

// MemoryResultCacheDefaultCleanupInterval is how often expired entries go.
const MemoryResultCacheDefaultCleanupInterval = 30 * time.Second

type memResult struct {
	key     ResultKey
	body    []byte
	expires time.Time
	all     *list.Element // in MemoryResultCache.lru
	own     *list.Element // in its provider's lru
}

type memProvider struct {
	lru   *list.List // of *memResult, most recently used first
	bytes int64
}

// MemoryResultCache is the single-process ResultCache: maps with expiry,
// least-recently-used eviction within its budget, and in-process wake-ups.
// Expired entries are invisible at once and removed by a sweep every
// CleanupInterval while started.
type MemoryResultCache struct {
	startstop.Base
	// CleanupInterval is the expiry sweep period (default 30 s). Set before Start.
	CleanupInterval time.Duration

	mu        sync.Mutex
	budget    ResultCacheBudget
	results   map[ResultKey]*memResult
	lru       *list.List // of *memResult, most recently used first
	providers map[uuid.UUID]*memProvider
	bytes     int64
	inflight  map[ResultKey]time.Time
	waiters   *keywait.Registry[ResultKey]
	now       func() time.Time
}

// NewMemoryResultCache returns an empty in-memory cache held to budget.
func NewMemoryResultCache(budget ResultCacheBudget) *MemoryResultCache {
	return &MemoryResultCache{
		budget:    budget,
		results:   map[ResultKey]*memResult{},
		lru:       list.New(),
		providers: map[uuid.UUID]*memProvider{},
		inflight:  map[ResultKey]time.Time{},
		waiters:   keywait.New[ResultKey](),
		now:       time.Now,
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

// remove drops r; c.mu is held.
func (c *MemoryResultCache) remove(r *memResult) {
	delete(c.results, r.key)
	c.lru.Remove(r.all)
	p := c.providers[r.key.ProviderID]
	p.lru.Remove(r.own)
	p.bytes -= int64(len(r.body))
	c.bytes -= int64(len(r.body))
	if p.lru.Len() == 0 {
		delete(c.providers, r.key.ProviderID)
	}
}

// DeleteExpired removes expired results and locks and returns how many went.
func (c *MemoryResultCache) DeleteExpired() int {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, r := range c.results {
		if !now.Before(r.expires) {
			c.remove(r)
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

// Usage implements ResultCache.
func (c *MemoryResultCache) Usage(context.Context) (bytes, entries int64, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes, int64(len(c.results)), nil
}

// Get implements ResultCache.
func (c *MemoryResultCache) Get(_ context.Context, k ResultKey) ([]byte, bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.results[k]
	if !ok || !c.now().Before(r.expires) {
		return nil, false, nil
	}
	c.lru.MoveToFront(r.all)
	c.providers[k.ProviderID].lru.MoveToFront(r.own)
	return r.body, true, nil
}

// Store implements ResultCache.
func (c *MemoryResultCache) Store(_ context.Context, k ResultKey, body []byte, ttl time.Duration) error {
	if err := c.budget.admit(len(body)); err != nil {
		return err
	}
	if body == nil {
		body = []byte{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.results[k]; ok {
		c.remove(old)
	}
	p := c.providers[k.ProviderID]
	if p == nil {
		p = &memProvider{lru: list.New()}
		c.providers[k.ProviderID] = p
	}
	r := &memResult{key: k, body: body, expires: c.now().Add(ttl)}
	r.all = c.lru.PushFront(r)
	r.own = p.lru.PushFront(r)
	c.results[k] = r
	p.bytes += int64(len(body))
	c.bytes += int64(len(body))
	// The provider's own least recently used results go first, then
	// everybody's; the new result is never evicted (admit checked it fits).
	pb, pe := c.budget.ProviderMaxBytes(), c.budget.ProviderMaxEntries()
	for (pb > 0 && p.bytes > pb) || (pe > 0 && int64(p.lru.Len()) > pe) {
		c.remove(p.lru.Back().Value.(*memResult))
	}
	for (c.budget.MaxBytes > 0 && c.bytes > c.budget.MaxBytes) || (c.budget.MaxEntries > 0 && int64(len(c.results)) > c.budget.MaxEntries) {
		oldest := c.lru.Back().Value.(*memResult)
		if oldest == r {
			break
		}
		c.remove(oldest)
	}
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
	if p := c.providers[providerID]; p != nil {
		for p.lru.Len() > 0 {
			c.remove(p.lru.Front().Value.(*memResult))
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
