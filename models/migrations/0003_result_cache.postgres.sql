-- name: provider result cache and internal task results
-- down: PostgreSQL: DROP TABLE provider_results, provider_inflight; both: ALTER TABLE tasks DROP
--  COLUMN result (internal task results are lost).
--
-- Cached provider results live in UNLOGGED tables: they are a cache (losing
-- them in a crash only costs a re-dispatch) and skipping the WAL keeps uploads
-- cheap. Keys are (provider id, request hash), so a provider registered anew
-- under the same name never sees the old entries. SQLite deployments are one
-- process: the result cache is in memory there.

CREATE UNLOGGED TABLE provider_results (
	provider_id  uuid NOT NULL,
	request_hash text NOT NULL,
	body         bytea NOT NULL,
	expires_at   timestamptz NOT NULL,
	created_at   timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (provider_id, request_hash)
);
CREATE INDEX provider_results_expiry_idx ON provider_results (expires_at);
CREATE UNLOGGED TABLE provider_inflight (
	provider_id  uuid NOT NULL,
	request_hash text NOT NULL,
	expires_at   timestamptz NOT NULL,
	PRIMARY KEY (provider_id, request_hash)
);
CREATE INDEX provider_inflight_expiry_idx ON provider_inflight (expires_at);
ALTER TABLE tasks ADD COLUMN result text;
