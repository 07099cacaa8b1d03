-- name: idempotency keys of submissions
-- down: DROP TABLE idempotency_keys (retried submissions then create new tasks).
--
-- One row per (user, Idempotency-Key) a submission carried: the primary key
-- makes two concurrent submissions with one key create one task on any node
-- (the second waits for the first's transaction and replays its stored
-- answer). Deleted by the retention pass once older than
-- JOBLIB_IDEMPOTENCY_WINDOW.

CREATE TABLE idempotency_keys (
	user_id      TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
	key          TEXT NOT NULL,
	request_hash TEXT NOT NULL,
	response     TEXT NOT NULL DEFAULT '',
	created_at   TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
	PRIMARY KEY (user_id, key)
);
CREATE INDEX idempotency_keys_created_idx ON idempotency_keys (created_at);
