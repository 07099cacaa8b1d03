-- name: task counts kept incrementally
-- down: DROP the triggers tasks_count_* (PostgreSQL: and FUNCTION task_counts_track), then DROP
--  TABLE task_counts (PostgreSQL: and task_count_deltas). The joblib_tasks gauge needs them.
--
-- joblib_tasks{status} is read from task_counts, not by counting tasks: a
-- scrape costs the same at a thousand tasks or a million. Triggers keep the
-- counts. On PostgreSQL a status change appends a delta row (no row every
-- writer updates, so concurrent claims do not queue on a counter) and readers
-- fold the deltas into the counts first; SQLite has one writer and updates the
-- counts.

CREATE TABLE task_counts (
	status TEXT PRIMARY KEY,
	n      INTEGER NOT NULL DEFAULT 0
);
INSERT INTO task_counts (status, n) SELECT status, count(*) FROM tasks GROUP BY status;

-- statement begin
CREATE TRIGGER tasks_count_ins AFTER INSERT ON tasks BEGIN
	INSERT INTO task_counts (status, n) VALUES (NEW.status, 1) ON CONFLICT (status) DO UPDATE SET n = n + 1;
END;
-- statement end

-- statement begin
CREATE TRIGGER tasks_count_del AFTER DELETE ON tasks BEGIN
	UPDATE task_counts SET n = n - 1 WHERE status = OLD.status;
END;
-- statement end

-- statement begin
CREATE TRIGGER tasks_count_upd AFTER UPDATE OF status ON tasks WHEN OLD.status IS NOT NEW.status BEGIN
	UPDATE task_counts SET n = n - 1 WHERE status = OLD.status;
	INSERT INTO task_counts (status, n) VALUES (NEW.status, 1) ON CONFLICT (status) DO UPDATE SET n = n + 1;
END;
-- statement end
