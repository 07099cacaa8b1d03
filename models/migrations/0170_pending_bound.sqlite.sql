-- name: a bound on each user's pending tasks, so that a submission counts them only near the quota
-- down: DROP TRIGGER tasks_pending_bound; ALTER TABLE users DROP COLUMN pending_bound.
--
-- See the PostgreSQL file: users.pending_bound, when not NULL, is at least the
-- number of the user's pending tasks, and a submission that finds room below
-- the quota in it counts nothing. A task that goes back to pending forgets its
-- creator's bound (the next submission counts).

ALTER TABLE users ADD COLUMN pending_bound INTEGER;

-- statement begin
CREATE TRIGGER tasks_pending_bound AFTER UPDATE OF status ON tasks
WHEN NEW.status = 'pending' AND OLD.status IS NOT 'pending' AND NEW.created_by_id IS NOT NULL BEGIN
	UPDATE users SET pending_bound = NULL WHERE id = NEW.created_by_id AND pending_bound IS NOT NULL;
END;
-- statement end
