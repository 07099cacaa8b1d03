-- name: task indexes that a status change skips
-- down: CREATE INDEX tasks_full_worker_idx ON tasks (worker_id, status); DROP INDEX tasks_worker_idx; rename
--  tasks_full_worker_idx to tasks_worker_idx; the same for tasks_finished_idx with (status, completed_at).
--  SQLite: nothing.
--
-- A status change moves the task row to a new version, which every index whose
-- predicate the new version meets takes an entry for: a task's claim, start and
-- completion each wrote one to all of the task indexes. The worker index serves
-- only the held tasks (the cleanup of lost workers, the dashboard's active
-- counts) and the retention index only the finished ones (retention names the
-- status): as partial indexes, a task enters the worker index at its claim and
-- start and the retention index at its completion, three index writes per task
-- fewer.

CREATE INDEX tasks_held_worker_idx ON tasks (worker_id, status) WHERE status IN ('claimed', 'running');
DROP INDEX tasks_worker_idx;
ALTER INDEX tasks_held_worker_idx RENAME TO tasks_worker_idx;
CREATE INDEX tasks_finished_only_idx ON tasks (status, completed_at) WHERE status IN ('completed', 'failed', 'cancelled');
DROP INDEX tasks_finished_idx;
ALTER INDEX tasks_finished_only_idx RENAME TO tasks_finished_idx;
