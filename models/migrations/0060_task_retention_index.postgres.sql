-- name: task retention index
-- down: CREATE INDEX tasks_status_idx ON tasks (status); DROP INDEX tasks_finished_idx.
--
-- Retention deletes finished tasks by (status, completed_at) in batches; this
-- index makes each batch a range scan however large the table. Its leading
-- column serves every query the index on status alone served, so that one goes
-- (one index less per write).

CREATE INDEX IF NOT EXISTS tasks_finished_idx ON tasks (status, completed_at);
DROP INDEX IF EXISTS tasks_status_idx;
