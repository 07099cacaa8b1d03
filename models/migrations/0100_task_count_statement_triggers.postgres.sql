-- name: task count deltas per statement
-- down: PostgreSQL: DROP the three tasks_count_* statement triggers and FUNCTION
--  task_counts_track_statement, then run the function and the row triggers of 0011 again. SQLite:
--  nothing.
--
-- The row triggers of version 11 ran a function and inserted two delta rows
-- per changed task: a sweep that fails 50,000 tasks ran 50,000 trigger calls
-- and wrote 100,000 rows. Statement triggers read the statement's transition
-- tables and write one delta row per status it changed. PostgreSQL only:
-- SQLite has no statement triggers and keeps its row triggers.

-- statement begin
CREATE FUNCTION task_counts_track_statement() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
	IF TG_OP = 'INSERT' THEN
		INSERT INTO task_count_deltas (status, d) SELECT status, count(*) FROM task_counts_new GROUP BY status;
	ELSIF TG_OP = 'DELETE' THEN
		INSERT INTO task_count_deltas (status, d) SELECT status, -count(*) FROM task_counts_old GROUP BY status;
	ELSE
		INSERT INTO task_count_deltas (status, d)
		SELECT status, sum(d) FROM (
			SELECT status, -1 AS d FROM task_counts_old UNION ALL SELECT status, 1 AS d FROM task_counts_new
		) c GROUP BY status HAVING sum(d) <> 0;
	END IF;
	RETURN NULL;
END $$;
-- statement end

DROP TRIGGER tasks_count_insdel ON tasks;

DROP TRIGGER tasks_count_upd ON tasks;

CREATE TRIGGER tasks_count_ins AFTER INSERT ON tasks REFERENCING NEW TABLE AS task_counts_new FOR EACH STATEMENT EXECUTE FUNCTION task_counts_track_statement();

CREATE TRIGGER tasks_count_del AFTER DELETE ON tasks REFERENCING OLD TABLE AS task_counts_old FOR EACH STATEMENT EXECUTE FUNCTION task_counts_track_statement();

CREATE TRIGGER tasks_count_upd AFTER UPDATE ON tasks REFERENCING OLD TABLE AS task_counts_old NEW TABLE AS task_counts_new FOR EACH STATEMENT EXECUTE FUNCTION task_counts_track_statement();

DROP FUNCTION task_counts_track();
