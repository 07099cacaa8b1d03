-- name: cleanup audit: shadow plans, false positives, operator log
-- down: DROP TABLE audit_log; DROP INDEX cleanup_events_sweep_idx; ALTER TABLE cleanup_events DROP
--  COLUMN shadow, DROP COLUMN heard_at, DROP COLUMN heard_via (SQLite: one DROP COLUMN per
--  statement).

ALTER TABLE cleanup_events ADD COLUMN shadow BOOLEAN NOT NULL DEFAULT 0;
ALTER TABLE cleanup_events ADD COLUMN heard_at TEXT;
ALTER TABLE cleanup_events ADD COLUMN heard_via TEXT;
CREATE INDEX cleanup_events_sweep_idx ON cleanup_events (sweep_id);
CREATE TABLE audit_log (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	id         TEXT NOT NULL UNIQUE,
	action     TEXT NOT NULL,
	subject_id TEXT,
	actor      TEXT NOT NULL DEFAULT '',
	detail     TEXT NOT NULL DEFAULT '{}',
	created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now'))
);
CREATE INDEX audit_log_subject_idx ON audit_log (subject_id);
CREATE INDEX audit_log_created_idx ON audit_log (created_at);
