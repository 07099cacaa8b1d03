-- name: socket sessions kept for connection state recovery
-- down: PostgreSQL: DROP TABLE socket_sessions (clients then recover on the node that held them
--  only; stop every node first). SQLite: nothing.
--
-- The sessions of disconnected Socket.IO clients, kept for the recovery
-- window so that a client may recover on any node. Unlogged: after a crash
-- clients simply get fresh sessions. SQLite runs one node, which keeps them in
-- memory: nothing to do there.

CREATE UNLOGGED TABLE IF NOT EXISTS socket_sessions (
	pid        text PRIMARY KEY,
	sid        text NOT NULL,
	rooms      text NOT NULL,
	owner      text NOT NULL DEFAULT '',
	expires_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS socket_sessions_expiry_idx ON socket_sessions (expires_at);
