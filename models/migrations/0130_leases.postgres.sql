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
	name        text PRIMARY KEY,
	holder      text NOT NULL,
	epoch       bigint NOT NULL,
	acquired_at timestamptz NOT NULL,
	renewed_at  timestamptz NOT NULL,
	expires_at  timestamptz NOT NULL
);
