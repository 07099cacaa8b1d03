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
	run        text PRIMARY KEY,
	node_id    text NOT NULL,
	addr       text NOT NULL DEFAULT '',
	started_at timestamptz NOT NULL DEFAULT now(),
	renewed_at timestamptz NOT NULL DEFAULT now(),
	expires_at timestamptz NOT NULL
);
CREATE INDEX nodes_node_idx ON nodes (node_id);
CREATE INDEX nodes_expiry_idx ON nodes (expires_at);
CREATE UNLOGGED TABLE IF NOT EXISTS joblib_event_spill (
	id bigserial PRIMARY KEY, payload text NOT NULL, created_at timestamptz NOT NULL DEFAULT now()
);
