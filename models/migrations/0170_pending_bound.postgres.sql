-- name: a bound on each user's pending tasks, so that a submission counts them only near the quota
-- down: ALTER TABLE users DROP COLUMN pending_bound, then run the statement of 0161 that creates
--  task_counts_track_statement again. SQLite: DROP TRIGGER tasks_pending_bound; ALTER TABLE users DROP
--  COLUMN pending_bound. An older binary counts on every submission and ignores the column.
--
-- The pending-task quota counted the user's pending tasks on every submission:
-- with 50,000 of them queued, 50,000 index entries (11-21 ms of PostgreSQL time)
-- per submitted task. users.pending_bound, when not NULL, is at least the
-- number of the user's pending tasks. A submission under the user's quota lock
-- that finds room below the quota in it adds its tasks to the bound and counts
-- nothing; otherwise it counts, as before, and stores the count plus its tasks.
-- Claims and cancellations leave the bound as it is (it only gets looser), so a
-- user far below the quota counts once per (quota - pending) submissions.
--
-- Whatever adds pending tasks without going through the quota must forget the
-- bound (set it NULL, so that the next submission counts): the creations that
-- are exempt (no quota configured, superusers) do so in the statement, and every
-- change of a task back to pending (a requeue after a lost worker or a timeout, a
-- retry, an operator's retry) does so in the count trigger below, which every
-- such statement fires (the hot statements, which skip the trigger, never move
-- a task back to pending).

ALTER TABLE users ADD COLUMN pending_bound bigint;

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
		UPDATE users SET pending_bound = NULL WHERE pending_bound IS NOT NULL AND id IN (
			SELECT n.created_by_id FROM task_counts_new n JOIN task_counts_old o ON o.id = n.id
			WHERE n.status = 'pending' AND o.status <> 'pending');
	END IF;
	RETURN NULL;
END $$;
-- statement end
