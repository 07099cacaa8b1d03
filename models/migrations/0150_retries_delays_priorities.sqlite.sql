-- name: retries, delayed and prioritised tasks
-- down: DROP INDEX tasks_ready_idx; DROP INDEX tasks_delayed_idx; then ALTER TABLE ... DROP COLUMN for tasks.priority, run_at, delayed, errors and jobs.retry_backoff, retry_max_backoff (an older binary then claims delayed tasks at once and ignores priorities).
--
-- See the PostgreSQL file of this version.

ALTER TABLE jobs ADD COLUMN retry_backoff REAL;
ALTER TABLE jobs ADD COLUMN retry_max_backoff REAL;
ALTER TABLE tasks ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN run_at TEXT;
ALTER TABLE tasks ADD COLUMN delayed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN errors TEXT;
CREATE INDEX tasks_ready_idx ON tasks (job_id, priority DESC, seq) WHERE status = 'pending' AND NOT delayed;
CREATE INDEX tasks_delayed_idx ON tasks (run_at) WHERE status = 'pending' AND delayed;
