package models

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The statements of the PostgreSQL provider result cache. The service that
// runs them (listener, expiry loop, waiters) is joblib.PGResultCache.

// ResultKey identifies one cached provider result: the provider's id (not its
// name, so a provider registered anew never sees its predecessor's results)
// and the request hash.
type ResultKey struct {
	ProviderID uuid.UUID
	Hash       string
}

func (k ResultKey) String() string { return k.ProviderID.String() + ":" + k.Hash }

// ParseResultKey reads a key written by String.
func ParseResultKey(s string) (ResultKey, bool) {
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

// ResultBudget bounds the cached provider results: in total and per
// provider, by bytes and by entries. Zero fields are unbounded.
type ResultBudget struct {
	MaxBytes, ProviderMaxBytes     int64
	MaxEntries, ProviderMaxEntries int64
}

var errNotPostgres = errors.New("the provider result tables exist on PostgreSQL only")

func (db *DB) requirePool() error {
	if db.Pool == nil {
		return errNotPostgres
	}
	return nil
}

// ListenResults holds one LISTEN session on ResultChannel: it calls onReady
// once listening, then onKey for every announced key, until ctx ends or the
// session fails (the error says why). The connection leaves the pool for
// good: it carries LISTEN state and must never be handed to a query.
func (db *DB) ListenResults(ctx context.Context, onReady func(), onKey func(ResultKey)) error {
	if err := db.requirePool(); err != nil {
		return err
	}
	pc, err := db.Pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire listen connection: %w", err)
	}
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
		if k, ok := ParseResultKey(n.Payload); ok {
			onKey(k)
		}
	}
}

// DeleteExpiredResults removes expired results and inflight locks and the
// results of deleted providers; it returns how many rows went.
func (db *DB) DeleteExpiredResults(ctx context.Context) (int64, error) {
	if err := db.requirePool(); err != nil {
		return 0, err
	}
	var n int64
	for _, q := range []string{
		"DELETE FROM provider_results WHERE expires_at <= now()",
		"DELETE FROM provider_inflight WHERE expires_at <= now()",
		"DELETE FROM provider_results r WHERE NOT EXISTS (SELECT 1 FROM providers p WHERE p.id = r.provider_id)",
	} {
		tag, err := db.Pool.Exec(ctx, q)
		if err != nil {
			return n, fmt.Errorf("delete expired provider results: %w", err)
		}
		n += tag.RowsAffected()
	}
	return n, nil
}

// GetResult returns the cached, unexpired result of k and marks it used
// (the least recently used results are evicted first).
func (db *DB) GetResult(ctx context.Context, k ResultKey) ([]byte, bool, error) {
	if err := db.requirePool(); err != nil {
		return nil, false, err
	}
	var body []byte
	err := db.Pool.QueryRow(ctx,
		"UPDATE provider_results SET used_at = clock_timestamp() WHERE provider_id = $1 AND request_hash = $2 AND expires_at > now() RETURNING body",
		k.ProviderID.String(), k.Hash).Scan(&body)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read provider result: %w", err)
	}
	return body, true, nil
}

// StoreResult caches body under k for ttl, replacing an earlier result, then
// evicts least recently used results until k's provider and the whole cache
// are within budget, all in one transaction. It returns how many results it
// evicted. Concurrent stores on several nodes may leave the cache over
// budget by the entries they add at once, until the next store.
func (db *DB) StoreResult(ctx context.Context, k ResultKey, body []byte, ttl time.Duration, b ResultBudget) (int64, error) {
	if err := db.requirePool(); err != nil {
		return 0, err
	}
	if body == nil {
		body = []byte{}
	}
	var evicted int64
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx,
			"INSERT INTO provider_results (provider_id, request_hash, body, size, expires_at, used_at) VALUES ($1, $2, $3, $4, now() + $5 * interval '1 millisecond', clock_timestamp())"+
				" ON CONFLICT (provider_id, request_hash) DO UPDATE SET body = excluded.body, size = excluded.size, expires_at = excluded.expires_at, created_at = now(), used_at = excluded.used_at",
			k.ProviderID.String(), k.Hash, body, len(body), ttl.Milliseconds())
		if err != nil {
			return fmt.Errorf("store provider result: %w", err)
		}
		// Newest use first; everything past the running budget goes.
		const evict = `DELETE FROM provider_results r USING (
	SELECT provider_id, request_hash,
		sum(size) OVER w AS bytes, row_number() OVER w AS n
	FROM provider_results %s
	WINDOW w AS (ORDER BY used_at DESC, request_hash)
) x
WHERE r.provider_id = x.provider_id AND r.request_hash = x.request_hash
	AND ((x.bytes > $1 AND $1 > 0) OR (x.n > $2 AND $2 > 0))`
		if b.ProviderMaxBytes > 0 || b.ProviderMaxEntries > 0 {
			tag, err := tx.Exec(ctx, fmt.Sprintf(evict, "WHERE provider_id = $3"), b.ProviderMaxBytes, b.ProviderMaxEntries, k.ProviderID.String())
			if err != nil {
				return fmt.Errorf("evict provider results: %w", err)
			}
			evicted += tag.RowsAffected()
		}
		if b.MaxBytes > 0 || b.MaxEntries > 0 {
			tag, err := tx.Exec(ctx, fmt.Sprintf(evict, ""), b.MaxBytes, b.MaxEntries)
			if err != nil {
				return fmt.Errorf("evict provider results: %w", err)
			}
			evicted += tag.RowsAffected()
		}
		return nil
	})
	return evicted, err
}

// ResultUsage is the cached results' total size and number, expired ones
// included until swept.
func (db *DB) ResultUsage(ctx context.Context) (bytes, entries int64, err error) {
	if err := db.requirePool(); err != nil {
		return 0, 0, err
	}
	err = db.Pool.QueryRow(ctx, "SELECT coalesce(sum(size), 0), count(*) FROM provider_results").Scan(&bytes, &entries)
	if err != nil {
		return 0, 0, fmt.Errorf("read provider result usage: %w", err)
	}
	return bytes, entries, nil
}

// AcquireInflight takes the dispatch lock of k for ttl if nobody holds it (or
// the holder's lock expired). Exactly one of any number of concurrent callers,
// on any node, gets true.
func (db *DB) AcquireInflight(ctx context.Context, k ResultKey, ttl time.Duration) (bool, error) {
	if err := db.requirePool(); err != nil {
		return false, err
	}
	tag, err := db.Pool.Exec(ctx,
		"INSERT INTO provider_inflight (provider_id, request_hash, expires_at) VALUES ($1, $2, now() + $3 * interval '1 millisecond')"+
			" ON CONFLICT (provider_id, request_hash) DO UPDATE SET expires_at = excluded.expires_at WHERE provider_inflight.expires_at <= now()",
		k.ProviderID.String(), k.Hash, ttl.Milliseconds())
	if err != nil {
		return false, fmt.Errorf("acquire provider inflight lock: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// ReleaseInflight drops the dispatch lock of k.
func (db *DB) ReleaseInflight(ctx context.Context, k ResultKey) error {
	if err := db.requirePool(); err != nil {
		return err
	}
	if _, err := db.Pool.Exec(ctx, "DELETE FROM provider_inflight WHERE provider_id = $1 AND request_hash = $2", k.ProviderID.String(), k.Hash); err != nil {
		return fmt.Errorf("release provider inflight lock: %w", err)
	}
	return nil
}

// InflightHeld reports whether k's dispatch lock is held.
func (db *DB) InflightHeld(ctx context.Context, k ResultKey) (bool, error) {
	if err := db.requirePool(); err != nil {
		return false, err
	}
	var n int
	err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM provider_inflight WHERE provider_id = $1 AND request_hash = $2 AND expires_at > now()",
		k.ProviderID.String(), k.Hash).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("read provider inflight lock: %w", err)
	}
	return n > 0, nil
}

// NotifyResult announces k on ResultChannel to every node.
func (db *DB) NotifyResult(ctx context.Context, k ResultKey) error {
	if err := db.requirePool(); err != nil {
		return err
	}
	if _, err := db.Pool.Exec(ctx, "SELECT pg_notify($1, $2)", ResultChannel, k.String()); err != nil {
		return fmt.Errorf("notify provider result: %w", err)
	}
	return nil
}

// PurgeProviderResults drops every cached result and inflight lock of a provider.
func (db *DB) PurgeProviderResults(ctx context.Context, providerID uuid.UUID) error {
	if err := db.requirePool(); err != nil {
		return err
	}
	for _, q := range []string{
		"DELETE FROM provider_results WHERE provider_id = $1",
		"DELETE FROM provider_inflight WHERE provider_id = $1",
	} {
		if _, err := db.Pool.Exec(ctx, q, providerID.String()); err != nil {
			return fmt.Errorf("purge provider results: %w", err)
		}
	}
	return nil
}
