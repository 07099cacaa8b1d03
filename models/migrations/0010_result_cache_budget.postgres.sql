-- name: provider result cache budget
-- down: PostgreSQL: DROP INDEX provider_results_provider_used_idx; ALTER TABLE provider_results
--  DROP COLUMN size, DROP COLUMN used_at. SQLite: nothing.
--
-- Sizes and last use let the cache evict least recently used results past its
-- byte and entry budgets. SQLite keeps its result cache in memory: nothing to do.

ALTER TABLE provider_results ADD COLUMN size bigint NOT NULL DEFAULT 0;
ALTER TABLE provider_results ADD COLUMN used_at timestamptz NOT NULL DEFAULT now();
UPDATE provider_results SET size = length(body);
CREATE INDEX provider_results_provider_used_idx ON provider_results (provider_id, used_at);
