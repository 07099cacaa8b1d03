-- name: tasks keep the status they had before their last change
-- down: ALTER TABLE tasks DROP COLUMN prev_status, with no node of this version running (an older binary
--  neither reads nor writes it).
--
-- A status report counts its change as -1 for the status the task had and
-- +1 for the one it gets. RETURNING shows only the new row, so the report
-- statement joined each task a second time, as its snapshot saw it, to learn
-- the old status: one more primary-key lookup per task, about 4 of the 32
-- shared buffers a report touched. The statement now writes the old status
-- into this column as it changes the row (SET prev_status = t.status sees
-- the row it changes, also after a concurrent change) and reads it back.
-- Adding a nullable column without a default rewrites nothing.

ALTER TABLE tasks ADD COLUMN IF NOT EXISTS prev_status text;
