-- name: hot statements count their own changes
-- down: run the statement of 0100 that creates task_counts_track_statement again, as CREATE OR REPLACE.
--  SQLite: nothing.
--
-- The hot statements (claim, status reports, submit) write the delta rows of
-- their changes themselves, from rows they already hold, and mark the
-- statement counted with a transaction-local setting (models.hotCounted). The
-- statement trigger then returns at once for that statement and clears the
-- mark, so that no later statement of the transaction goes uncounted; every
-- other writer of tasks is counted by the trigger as before. The mark is
-- cleared with a session-level set: a local one would end with this function
-- (its SET clause scopes local changes to the call).

-- statement begin
CREATE OR REPLACE FUNCTION task_counts_track_statement() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
	IF current_setting('joblib.counted', true) = 'on' THEN
		PERFORM set_config('joblib.counted', 'off', false);
		RETURN NULL;
	END IF;
	IF TG_OP = 'INSERT' THEN
		INSERT INTO task_count_deltas (status, d) SELECT status, count(*) FROM task_counts_new GROUP BY status;
	ELSIF TG_OP = 'DELETE' THEN
		INSERT INTO task_count_deltas (status, d) SELECT status, -count(*) FROM task_counts_old GROUP BY status;
	ELSE
		INSERT INTO task_count_deltas (status, d)
		SELECT status, sum(d) FROM (
			SELECT status, -count(*) AS d FROM task_counts_old GROUP BY status
			UNION ALL SELECT status, count(*) AS d FROM task_counts_new GROUP BY status
		) c GROUP BY status HAVING sum(d) <> 0;
	END IF;
	RETURN NULL;
END $$;
-- statement end
