-- name: provider result cache and internal task results
-- down: PostgreSQL: DROP TABLE provider_results, provider_inflight; both: ALTER TABLE tasks DROP
--  COLUMN result (internal task results are lost).
--
-- Cached provider results live in UNLOGGED tables: they are a cache (losing
-- them in a crash only costs a re-dispatch) and skipping the WAL keeps uploads
-- cheap. Keys are (provider id, request hash), so a provider registered anew
-- under the same name never sees the old entries. SQLite deployments are one
-- process: the result cache is in memory there.

ALTER TABLE tasks ADD COLUMN result TEXT;
