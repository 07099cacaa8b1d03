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
	status text PRIMARY KEY,
	n      bigint NOT NULL DEFAULT 0
);
CREATE TABLE task_count_deltas (
	status text NOT NULL,
	d      integer NOT NULL
);
LOCK TABLE tasks IN SHARE MODE;
INSERT INTO task_counts (status, n) SELECT status, count(*) FROM tasks GROUP BY status;

-- statement begin
CREATE FUNCTION task_counts_track() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
	IF TG_OP = 'INSERT' THEN
		INSERT INTO task_count_deltas (status, d) VALUES (NEW.status, 1);
	ELSIF TG_OP = 'DELETE' THEN
		INSERT INTO task_count_deltas (status, d) VALUES (OLD.status, -1);
	ELSE
		INSERT INTO task_count_deltas (status, d) VALUES (OLD.status, -1), (NEW.status, 1);
	END IF;
	RETURN NULL;
END $$;
-- statement end

CREATE TRIGGER tasks_count_insdel AFTER INSERT OR DELETE ON tasks FOR EACH ROW EXECUTE FUNCTION task_counts_track();

CREATE TRIGGER tasks_count_upd AFTER UPDATE OF status ON tasks FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION task_counts_track();
