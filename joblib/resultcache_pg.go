package joblib

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/keywait"
	"github.com/zndraw/joblib/internal/startstop"
	"github.com/zndraw/joblib/models"
)

// PGResultCacheDefaultCleanupInterval is how often expired rows are deleted.
const PGResultCacheDefaultCleanupInterval = 30 * time.Second

// PGResultCacheConfig tunes a PGResultCache. The zero value is fine.
type PGResultCacheConfig struct {
	// CleanupInterval is the period of the expiry sweep (default 30 s).
	CleanupInterval time.Duration
	// Budget bounds the cache (zero: unbounded).
	Budget ResultCacheBudget
	// Logger receives listener reconnects and cleanup failures (default: discard).
	Logger *slog.Logger
}

// PGResultCache is the provider result cache for multi-node deployments:
// results and inflight locks live in UNLOGGED tables with an expiry (the
// statements are models'), and a reader waiting on one node is woken by an
// upload on any node through LISTEN/NOTIFY on a dedicated connection.
// Waiting never holds a pool connection; only the short Get queries do.
type PGResultCache struct {
	startstop.Base
	db       *models.DB
	log      *slog.Logger
	interval time.Duration
	budget   ResultCacheBudget
	waiters  *keywait.Registry[ResultKey]
}

// NewPGResultCache builds a cache over a PostgreSQL DB. Start it before use:
// without the listener, waits only end by timeout.
func NewPGResultCache(db *models.DB, cfg PGResultCacheConfig) (*PGResultCache, error) {
	if !db.Caps().SharedResultCache {
		return nil, errors.New("the PostgreSQL result cache needs a PostgreSQL database")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.CleanupInterval <= 0 {
		cfg.CleanupInterval = PGResultCacheDefaultCleanupInterval
	}
	return &PGResultCache{db: db, log: cfg.Logger, interval: cfg.CleanupInterval, budget: cfg.Budget, waiters: keywait.New[ResultKey]()}, nil
}

// Start opens the LISTEN connection (returning its error if the first attempt
// fails) and starts the listener and the expiry sweep in the background.
func (c *PGResultCache) Start(ctx context.Context) error {
	sctx, ok := c.StartInit(ctx)
	if !ok {
		return nil
	}
	ready := make(chan error, 1)
	c.Go(func() { c.listen(sctx, ready) })
	select {
	case err := <-ready:
		if err != nil {
			c.Stop()
			return fmt.Errorf("start result cache listener: %w", err)
		}
	case <-ctx.Done():
		c.Stop()
		return ctx.Err()
	}
	c.Go(func() { c.cleanupLoop(sctx) })
	return nil
}

// listen keeps one LISTEN session open, reconnecting with jittered backoff
// (1 s doubling to 64 s). After every (re)connect all waiters re-check,
// since notifications sent during the gap are lost.
func (c *PGResultCache) listen(ctx context.Context, ready chan<- error) {
	first := true
	backoff := time.Second
	for {
		err := c.db.ListenResults(ctx, func() {
			if first {
				first = false
				ready <- nil
			}
			backoff = time.Second
			c.waiters.WakeAll()
		}, c.waiters.Wake)
		if ctx.Err() != nil {
			return
		}
		if first {
			ready <- err
			return
		}
		wait := backoff + time.Duration(rand.Int64N(int64(backoff/5)+1)) - backoff/10
		c.log.Warn("result cache listener lost; reconnecting", "err", err, "in", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(backoff*2, 64*time.Second)
	}
}

// cleanupLoop deletes expired results and locks, and results of providers
// that no longer exist, every interval. Expired rows are invisible to Get
// anyway, so nothing is gained by a sweep at start.
func (c *PGResultCache) cleanupLoop(ctx context.Context) {
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := c.DeleteExpired(ctx); err != nil && ctx.Err() == nil {
			c.log.Error("result cache cleanup", "err", err)
		}
	}
}

// DeleteExpired removes expired results and inflight locks and the results of
// deleted providers; it returns how many rows went.
func (c *PGResultCache) DeleteExpired(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return c.db.DeleteExpiredResults(ctx)
}

// Get implements ResultCache.
func (c *PGResultCache) Get(ctx context.Context, k ResultKey) ([]byte, bool, error) {
	return c.db.GetResult(ctx, k)
}

// Store implements ResultCache: the result replaces an earlier one, then
// least recently used results are evicted until the provider and the cache
// are within budget. A body larger than a provider's share is refused.
func (c *PGResultCache) Store(ctx context.Context, k ResultKey, body []byte, ttl time.Duration) error {
	if err := c.budget.admit(len(body)); err != nil {
		return err
	}
	_, err := c.db.StoreResult(ctx, k, body, ttl, c.budget.models())
	return err
}

// Usage implements ResultCache.
func (c *PGResultCache) Usage(ctx context.Context) (bytes, entries int64, err error) {
	return c.db.ResultUsage(ctx)
}

// AcquireInflight implements ResultCache.
func (c *PGResultCache) AcquireInflight(ctx context.Context, k ResultKey, ttl time.Duration) (bool, error) {
	return c.db.AcquireInflight(ctx, k, ttl)
}

// ReleaseInflight implements ResultCache.
func (c *PGResultCache) ReleaseInflight(ctx context.Context, k ResultKey) error {
	return c.db.ReleaseInflight(ctx, k)
}

// Inflight reports whether k's dispatch lock is held.
func (c *PGResultCache) Inflight(ctx context.Context, k ResultKey) (bool, error) {
	return c.db.InflightHeld(ctx, k)
}

// Wait returns k's result as soon as it is cached, or nothing after timeout.
// It subscribes before it checks, so an upload between the check and the
// wait is never missed.
func (c *PGResultCache) Wait(ctx context.Context, k ResultKey, timeout time.Duration) ([]byte, bool, error) {
	return keywait.Wait(ctx, c.waiters, k, timeout, func(ctx context.Context) ([]byte, bool, error) { return c.Get(ctx, k) })
}

// Notify wakes the waiters of k on this node at once and, through NOTIFY, on
// every node.
func (c *PGResultCache) Notify(ctx context.Context, k ResultKey) error {
	c.waiters.Wake(k)
	return c.db.NotifyResult(ctx, k)
}

// PurgeProvider implements ResultCache.
func (c *PGResultCache) PurgeProvider(ctx context.Context, providerID uuid.UUID) error {
	return c.db.PurgeProviderResults(ctx, providerID)
}

// Waiting is the number of readers of k waiting on this node (tests, metrics).
func (c *PGResultCache) Waiting(k ResultKey) int { return c.waiters.Waiting(k) }
