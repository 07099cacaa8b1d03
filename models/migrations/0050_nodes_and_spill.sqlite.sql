-- name: node leases and the event spill table
-- down: DROP TABLE nodes (PostgreSQL: and joblib_event_spill, only while no node runs).
--
-- nodes holds one lease per running process (per run): renewed on the
-- database clock, it lapses when the process dies, and a surviving node then
-- releases the sockets it held. The PostgreSQL bus's spill table (event
-- batches too large for one NOTIFY) is part of the schema: the bus only uses
-- it. Older builds created it at bus start; IF NOT EXISTS keeps those
-- databases valid.

CREATE TABLE nodes (
	run        TEXT PRIMARY KEY,
	node_id    TEXT NOT NULL,
	addr       TEXT NOT NULL DEFAULT '',
	started_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
	renewed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
	expires_at TEXT NOT NULL
);
CREATE INDEX nodes_node_idx ON nodes (node_id);
CREATE INDEX nodes_expiry_idx ON nodes (expires_at);
