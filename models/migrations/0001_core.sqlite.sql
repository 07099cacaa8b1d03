-- name: core
-- down: DROP TABLE cleanup_events, providers, tasks, worker_job_links, jobs, workers, api_tokens,
--  users (every row is lost; this is dropping the whole database's contents).

CREATE TABLE users (
	seq          INTEGER PRIMARY KEY AUTOINCREMENT,
	id           TEXT NOT NULL UNIQUE,
	name         TEXT NOT NULL UNIQUE,
	email        TEXT,
	is_active    BOOLEAN NOT NULL DEFAULT 1,
	is_superuser BOOLEAN NOT NULL DEFAULT 0,
	created_at   TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now'))
);
CREATE TABLE api_tokens (
	id           TEXT PRIMARY KEY,
	user_id      TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
	token_hash   TEXT NOT NULL UNIQUE,
	name         TEXT NOT NULL DEFAULT '',
	created_at   TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
	last_used_at TEXT
);
CREATE TABLE workers (
	seq            INTEGER PRIMARY KEY AUTOINCREMENT,
	id             TEXT NOT NULL UNIQUE,
	user_id        TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
	last_heartbeat TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
	created_at     TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
	session_epoch  INTEGER NOT NULL DEFAULT 0,
	node_id        TEXT,
	node_run       TEXT,
	bound_at       TEXT
);
CREATE INDEX workers_user_idx ON workers (user_id);
CREATE INDEX workers_heartbeat_idx ON workers (last_heartbeat);
CREATE INDEX workers_created_idx ON workers (created_at, seq);
CREATE INDEX workers_node_idx ON workers (node_id, node_run);
CREATE TABLE jobs (
	seq            INTEGER PRIMARY KEY AUTOINCREMENT,
	id             TEXT NOT NULL UNIQUE,
	room_id        TEXT NOT NULL,
	category       TEXT NOT NULL,
	name           TEXT NOT NULL,
	schema         TEXT NOT NULL DEFAULT '{}',
	deleted        BOOLEAN NOT NULL DEFAULT 0,
	deleted_at     TEXT,
	on_worker_loss TEXT NOT NULL DEFAULT 'fail',
	max_attempts   INTEGER NOT NULL DEFAULT 1,
	created_at     TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
	CONSTRAINT unique_job UNIQUE (room_id, category, name)
);
CREATE INDEX jobs_room_idx ON jobs (room_id, deleted);
CREATE INDEX jobs_created_idx ON jobs (created_at, seq);
CREATE TABLE worker_job_links (
	worker_id TEXT NOT NULL REFERENCES workers(id) ON DELETE CASCADE,
	job_id    TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
	PRIMARY KEY (worker_id, job_id)
);
CREATE INDEX worker_job_links_job_idx ON worker_job_links (job_id);
CREATE TABLE tasks (
	seq            INTEGER PRIMARY KEY AUTOINCREMENT,
	id             TEXT NOT NULL UNIQUE,
	job_id         TEXT NOT NULL REFERENCES jobs(id),
	worker_id      TEXT,
	lost_worker_id TEXT,
	room_id        TEXT NOT NULL,
	created_by_id  TEXT REFERENCES users(id) ON DELETE SET NULL,
	payload        TEXT NOT NULL DEFAULT '{}',
	status         TEXT NOT NULL DEFAULT 'pending',
	attempt        INTEGER NOT NULL DEFAULT 0,
	created_at     TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
	claimed_at     TEXT,
	started_at     TEXT,
	completed_at   TEXT,
	updated_at     TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
	error          TEXT
);
CREATE INDEX tasks_claim_idx ON tasks (job_id, status, seq);
CREATE INDEX tasks_worker_idx ON tasks (worker_id, status);
CREATE INDEX tasks_room_idx ON tasks (room_id, created_at, seq);
CREATE INDEX tasks_status_idx ON tasks (status);
CREATE INDEX tasks_pending_idx ON tasks (seq) WHERE status = 'pending';
CREATE TABLE providers (
	seq          INTEGER PRIMARY KEY AUTOINCREMENT,
	id           TEXT NOT NULL UNIQUE,
	room_id      TEXT NOT NULL,
	category     TEXT NOT NULL,
	name         TEXT NOT NULL,
	schema       TEXT NOT NULL DEFAULT '{}',
	content_type TEXT NOT NULL DEFAULT 'application/json',
	user_id      TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
	worker_id    TEXT NOT NULL REFERENCES workers(id) ON DELETE CASCADE,
	created_at   TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
	CONSTRAINT unique_provider UNIQUE (room_id, category, name)
);
CREATE INDEX providers_worker_idx ON providers (worker_id);
CREATE INDEX providers_room_idx ON providers (room_id, created_at, seq);
CREATE TABLE cleanup_events (
	seq             INTEGER PRIMARY KEY AUTOINCREMENT,
	id              TEXT NOT NULL UNIQUE,
	sweep_id        TEXT,
	path            TEXT NOT NULL,
	worker_id       TEXT NOT NULL,
	user_id         TEXT,
	tasks_failed    INTEGER NOT NULL DEFAULT 0,
	tasks_requeued  INTEGER NOT NULL DEFAULT 0,
	providers       INTEGER NOT NULL DEFAULT 0,
	jobs_deleted    INTEGER NOT NULL DEFAULT 0,
	last_heartbeat  TEXT,
	db_now          TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
	threshold_ms    INTEGER,
	detail          TEXT NOT NULL DEFAULT '{}',
	created_at      TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now'))
);
CREATE INDEX cleanup_events_worker_idx ON cleanup_events (worker_id);
CREATE INDEX cleanup_events_created_idx ON cleanup_events (created_at);
