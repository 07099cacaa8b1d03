package models

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/zndraw/joblib/internal/keywait"
	"github.com/zndraw/joblib/internal/startstop"
)

// ResultKey identifies one cached provider result: the provider's id (not its
// name, so a provider registered anew never sees its predecessor's results)
// and the request hash.
type ResultKey struct {
	ProviderID uuid.UUID
	Hash       string
}

func (k ResultKey) String() string { return k.ProviderID.String() + ":" + k.Hash }

func parseResultKey(s string) (ResultKey, bool) {
	id, hash, ok := strings.Cut(s, ":")
	if !ok {
		return ResultKey{}, false
	}
	pid, err := uuid.Parse(id)
	if err != nil {
		return ResultKey{}, false
	}
	return ResultKey{ProviderID: pid, Hash: hash}, true
}

// ResultChannel is the PostgreSQL NOTIFY channel on which uploads announce
// "key populated". The payload is the key (provider id:request hash).
const ResultChannel = "joblib_provider_results"

// PGResultCacheDefaultCleanupInterval is how often expired rows are deleted.
const PGResultCacheDefaultCleanupInterval = 30 * time.Second

// PGResultCacheConfig tunes a PGResultCache. The zero value is fine.
type PGResultCacheConfig struct {
	// CleanupInterval is the period of the expiry sweep (default 30 s).
	CleanupInterval time.Duration
	// Logger receives listener reconnects and cleanup failures (default: discard).
	Logger *slog.Logger
}

// PGResultCache is the provider result cache for multi-node deployments:
// results and inflight locks live in UNLOGGED tables with an expiry, and a
// reader waiting on one node is woken by an upload on any node through
// LISTEN/NOTIFY on a dedicated connection. Waiting never holds a pool
// connection; only the short Get queries do.
type PGResultCache struct {
	startstop.Base
	db       *DB
	log      *slog.Logger
	interval time.Duration
	waiters  *keywait.Registry[ResultKey]
}

// NewPGResultCache builds a cache over a PostgreSQL DB. Start it before use:
// without the listener, waits only end by timeout.
func NewPGResultCache(db *DB, cfg PGResultCacheConfig) (*PGResultCache, error) {
	if db.dialect != Postgres || db.Pool == nil {
		return nil, errors.New("the PostgreSQL result cache needs a PostgreSQL database")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.CleanupInterval <= 0 {
		cfg.CleanupInterval = PGResultCacheDefaultCleanupInterval
	}
	return &PGResultCache{db: db, log: cfg.Logger, interval: cfg.CleanupInterval, waiters: keywait.New[ResultKey]()}, nil
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

// listen keeps one LISTEN connection open, reconnecting with jittered
// backoff (1 s doubling to 64 s). After every (re)connect all waiters re-check,
// since notifications sent during the gap are lost.
func (c *PGResultCache) listen(ctx context.Context, ready chan<- error) {
	first := true
	backoff := time.Second
	for {
		err := c.listenOnce(ctx, func() {
			if first {
				first = false
				ready <- nil
			}
			backoff = time.Second
			c.waiters.WakeAll()
		})
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

func (c *PGResultCache) listenOnce(ctx context.Context, onReady func()) error {
	pc, err := c.db.Pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire listen connection: %w", err)
	}
	// The connection leaves the pool for good: it carries LISTEN state and
	// must never be handed to a query.
	conn := pc.Hijack()
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+ResultChannel); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	onReady()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("wait for notification: %w", err)
		}
		if k, ok := parseResultKey(n.Payload); ok {
			c.waiters.Wake(k)
		}
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
	var n int64
	for _, q := range []string{
		"DELETE FROM provider_results WHERE expires_at <= now()",
		"DELETE FROM provider_inflight WHERE expires_at <= now()",
		"DELETE FROM provider_results r WHERE NOT EXISTS (SELECT 1 FROM providers p WHERE p.id = r.provider_id)",
	} {
		tag, err := c.db.Pool.Exec(ctx, q)
		if err != nil {
			return n, fmt.Errorf("delete expired provider results: %w", err)
		}
		n += tag.RowsAffected()
	}
	return n, nil
}

// Get returns the cached, unexpired result of k.
func (c *PGResultCache) Get(ctx context.Context, k ResultKey) ([]byte, bool, error) {
	var body []byte
	err := c.db.Pool.QueryRow(ctx,
		"SELECT body FROM provider_results WHERE provider_id = $1 AND request_hash = $2 AND expires_at > now()",
		k.ProviderID.String(), k.Hash).Scan(&body)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read provider result: %w", err)
	}
	return body, true, nil
}

// Store caches body under k for ttl, replacing an earlier result.
func (c *PGResultCache) Store(ctx context.Context, k ResultKey, body []byte, ttl time.Duration) error {
	if body == nil {
		body = []byte{}
	}
	_, err := c.db.Pool.Exec(ctx,
		"INSERT INTO provider_results (provider_id, request_hash, body, expires_at) VALUES ($1, $2, $3, now() + $4 * interval '1 millisecond')"+
			" ON CONFLICT (provider_id, request_hash) DO UPDATE SET body = excluded.body, expires_at = excluded.expires_at, created_at = now()",
		k.ProviderID.String(), k.Hash, body, ttl.Milliseconds())
	if err != nil {
		return fmt.Errorf("store provider result: %w", err)
	}
	return nil
}

// AcquireInflight takes the dispatch lock of k for ttl if nobody holds it (or
// the holder's lock expired). Exactly one of any number of concurrent callers,
// on any node, gets true.
func (c *PGResultCache) AcquireInflight(ctx context.Context, k ResultKey, ttl time.Duration) (bool, error) {
	tag, err := c.db.Pool.Exec(ctx,
		"INSERT INTO provider_inflight (provider_id, request_hash, expires_at) VALUES ($1, $2, now() + $3 * interval '1 millisecond')"+
			" ON CONFLICT (provider_id, request_hash) DO UPDATE SET expires_at = excluded.expires_at WHERE provider_inflight.expires_at <= now()",
		k.ProviderID.String(), k.Hash, ttl.Milliseconds())
	if err != nil {
		return false, fmt.Errorf("acquire provider inflight lock: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// ReleaseInflight drops the dispatch lock of k.
func (c *PGResultCache) ReleaseInflight(ctx context.Context, k ResultKey) error {
	if _, err := c.db.Pool.Exec(ctx, "DELETE FROM provider_inflight WHERE provider_id = $1 AND request_hash = $2", k.ProviderID.String(), k.Hash); err != nil {
		return fmt.Errorf("release provider inflight lock: %w", err)
	}
	return nil
}

// Inflight reports whether k's dispatch lock is held.
func (c *PGResultCache) Inflight(ctx context.Context, k ResultKey) (bool, error) {
	var n int
	err := c.db.Pool.QueryRow(ctx, "SELECT count(*) FROM provider_inflight WHERE provider_id = $1 AND request_hash = $2 AND expires_at > now()",
		k.ProviderID.String(), k.Hash).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("read provider inflight lock: %w", err)
	}
	return n > 0, nil
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
	if _, err := c.db.Pool.Exec(ctx, "SELECT pg_notify($1, $2)", ResultChannel, k.String()); err != nil {
		return fmt.Errorf("notify provider result: %w", err)
	}
	return nil
}

// PurgeProvider drops every cached result and inflight lock of a provider.
func (c *PGResultCache) PurgeProvider(ctx context.Context, providerID uuid.UUID) error {
	for _, q := range []string{
		"DELETE FROM provider_results WHERE provider_id = $1",
		"DELETE FROM provider_inflight WHERE provider_id = $1",
	} {
		if _, err := c.db.Pool.Exec(ctx, q, providerID.String()); err != nil {
			return fmt.Errorf("purge provider results: %w", err)
		}
	}
	return nil
}

// Waiting is the number of readers of k waiting on this node (tests, metrics).
func (c *PGResultCache) Waiting(k ResultKey) int { return c.waiters.Waiting(k) }
