-- name: leadership leases
-- down: DROP TABLE leases, with every node stopped (older builds lead through an advisory lock
--  instead).
--
-- One row per leadership (the sweeper): the holder (a node run) renews it on
-- the database clock, anyone takes it once it has expired, and the epoch moves
-- on at each hand-over. The leader's writes carry the epoch (LeaderFence), so a
-- leader that was paused and woke after a take-over writes nothing. A session
-- advisory lock held leadership before: PostgreSQL keeps it for a stopped
-- process as long as its connection lives.

CREATE TABLE IF NOT EXISTS leases (
	name        TEXT PRIMARY KEY,
	holder      TEXT NOT NULL,
	epoch       INTEGER NOT NULL,
	acquired_at TEXT NOT NULL,
	renewed_at  TEXT NOT NULL,
	expires_at  TEXT NOT NULL
);
