-- name: task deadlines and progress
-- down: DROP INDEX tasks_deadline_idx, audit_log_action_idx; ALTER TABLE tasks DROP COLUMN
--  task_timeout, heartbeat_timeout, deadline_at, progress_current, progress_total,
--  progress_message, progress_at; ALTER TABLE jobs DROP COLUMN task_timeout, heartbeat_timeout,
--  on_timeout (SQLite: one DROP COLUMN per statement, indexes first).
--
-- A job's limits (seconds) are copied onto each task at submission (a
-- submission may set its own task_timeout): a claim computes the task's
-- deadline_at from them on the database clock, and a progress report moves it.
-- The sweeper finds the earliest deadline of the held tasks on the partial
-- index: an idle sweep reads one entry. The dashboard reads the latest
-- timeouts' audit rows by action.

ALTER TABLE jobs ADD COLUMN task_timeout INTEGER;
ALTER TABLE jobs ADD COLUMN heartbeat_timeout INTEGER;
ALTER TABLE jobs ADD COLUMN on_timeout TEXT NOT NULL DEFAULT 'fail';
ALTER TABLE tasks ADD COLUMN task_timeout INTEGER;
ALTER TABLE tasks ADD COLUMN heartbeat_timeout INTEGER;
ALTER TABLE tasks ADD COLUMN deadline_at TEXT;
ALTER TABLE tasks ADD COLUMN progress_current REAL;
ALTER TABLE tasks ADD COLUMN progress_total REAL;
ALTER TABLE tasks ADD COLUMN progress_message TEXT;
ALTER TABLE tasks ADD COLUMN progress_at TEXT;
CREATE INDEX tasks_deadline_idx ON tasks (deadline_at) WHERE status IN ('claimed', 'running');
CREATE INDEX audit_log_action_idx ON audit_log (action, seq);
