-- name: event outbox
-- down: PostgreSQL: DROP TABLE joblib_event_outbox, with every node stopped (unsent events are
--  lost). SQLite: nothing.
--
-- The events a PostgreSQL mutation sends to other nodes are rows of this
-- table, written by the mutation's own statement or transaction, so they exist
-- exactly when the change committed; a relay on any node sends the committed
-- rows with NOTIFY, in id order, and deletes them (DB.RelayOutbox). A NOTIFY
-- inside the mutation would serialise every mutation's commit on PostgreSQL's
-- notify-queue lock. Unlogged: the rows are as durable as the NOTIFY queue they
-- replace (a PostgreSQL crash loses both, and every listener reconnects and
-- reports the gap). SQLite runs one node: events are delivered in-process.

CREATE UNLOGGED TABLE IF NOT EXISTS joblib_event_outbox (
	id      bigserial PRIMARY KEY,
	payload text NOT NULL
);
