-- name: the count triggers skip the hot statements without calling their function
-- down: run the three CREATE TRIGGER statements of 0100 again, after dropping these (an older binary
--  still counts correctly with these triggers: see below).
--
-- The hot statements count their own changes (0161) and mark the transaction
-- counted; the statement trigger then still ran its plpgsql function once
-- per hot statement, only to see the mark and return: a function call with
-- its own search_path (a configuration save and restore), an SPI connection
-- and a set_config, about 4 % of PostgreSQL's CPU in the contract flow. A
-- WHEN clause now skips the call. PostgreSQL evaluates a statement
-- trigger's WHEN when the statement's change to the table ends, so the hot
-- statements now set the mark in the change's own condition
-- (models.hotCountedQual) rather than in their select list.
--
-- The function keeps its check of the mark: a node of the previous version,
-- during a rolling upgrade, sets the mark only in its select list, after
-- the WHEN clause has let the trigger through, and the function then skips
-- that statement as before.

DROP TRIGGER tasks_count_ins ON tasks;
CREATE TRIGGER tasks_count_ins AFTER INSERT ON tasks REFERENCING NEW TABLE AS task_counts_new FOR EACH STATEMENT WHEN (current_setting('joblib.counted', true) IS DISTINCT FROM 'on') EXECUTE FUNCTION task_counts_track_statement();
DROP TRIGGER tasks_count_del ON tasks;
CREATE TRIGGER tasks_count_del AFTER DELETE ON tasks REFERENCING OLD TABLE AS task_counts_old FOR EACH STATEMENT WHEN (current_setting('joblib.counted', true) IS DISTINCT FROM 'on') EXECUTE FUNCTION task_counts_track_statement();
DROP TRIGGER tasks_count_upd ON tasks;
CREATE TRIGGER tasks_count_upd AFTER UPDATE ON tasks REFERENCING OLD TABLE AS task_counts_old NEW TABLE AS task_counts_new FOR EACH STATEMENT WHEN (current_setting('joblib.counted', true) IS DISTINCT FROM 'on') EXECUTE FUNCTION task_counts_track_statement();
