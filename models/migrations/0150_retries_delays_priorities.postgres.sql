-- name: retries, delayed and prioritised tasks
-- down: DROP INDEX tasks_ready_idx, tasks_delayed_idx; ALTER TABLE tasks DROP COLUMN priority, DROP COLUMN run_at, DROP COLUMN delayed, DROP COLUMN errors; ALTER TABLE jobs DROP COLUMN retry_backoff, DROP COLUMN retry_max_backoff (an older binary then claims delayed tasks at once and ignores priorities).
--
-- A job's retry policy: a failed report puts the task back to pending after
-- a backoff of retry_backoff × 2^(attempt-1) seconds, at most
-- retry_max_backoff (NULL retry_backoff: no retry). A task carries its
-- priority, the time it may run from (run_at) and whether it still waits
-- for it (delayed): the leader clears delayed once run_at has passed on the
-- database clock. Claims walk tasks_ready_idx, which holds only the
-- claimable pending tasks in claim order, so a claim never reads a delayed
-- task; the leader finds the next due one as the first entry of
-- tasks_delayed_idx. errors keeps the last failed attempts' errors (JSON).

ALTER TABLE jobs ADD COLUMN retry_backoff double precision;
ALTER TABLE jobs ADD COLUMN retry_max_backoff double precision;
ALTER TABLE tasks ADD COLUMN priority integer NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN run_at timestamptz;
ALTER TABLE tasks ADD COLUMN delayed boolean NOT NULL DEFAULT false;
ALTER TABLE tasks ADD COLUMN errors text;
CREATE INDEX tasks_ready_idx ON tasks (job_id, priority DESC, seq) WHERE status = 'pending' AND NOT delayed;
CREATE INDEX tasks_delayed_idx ON tasks (run_at) WHERE status = 'pending' AND delayed;
