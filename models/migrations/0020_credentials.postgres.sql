-- name: credentials: token expiry and revocation, job creators, quota indexes
-- down: DROP INDEX api_tokens_user_idx, tasks_creator_pending_idx, providers_user_idx; ALTER TABLE
--  api_tokens DROP COLUMN expires_at, DROP COLUMN revoked_at; ALTER TABLE jobs DROP COLUMN
--  created_by_id (tokens then never expire).

ALTER TABLE api_tokens ADD COLUMN expires_at timestamptz;
ALTER TABLE api_tokens ADD COLUMN revoked_at timestamptz;
CREATE INDEX api_tokens_user_idx ON api_tokens (user_id);
ALTER TABLE jobs ADD COLUMN created_by_id uuid REFERENCES users(id) ON DELETE SET NULL;
CREATE INDEX tasks_creator_pending_idx ON tasks (created_by_id) WHERE status = 'pending';
CREATE INDEX providers_user_idx ON providers (user_id);
