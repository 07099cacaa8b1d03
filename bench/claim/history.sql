-- A server's history for bench/claim (-setup-sql "$(cat bench/claim/history.sql)"): 400 other jobs and
-- 20,000 completed tasks, analysed, so that PostgreSQL plans the hot statements as it does on a server
-- that has run for a while rather than on near-empty tables.
INSERT INTO users (id, name) VALUES ('00000000-0000-4000-8000-000000000001', 'history');
INSERT INTO jobs (id, room_id, category, name) SELECT ('00000000-0000-4000-8000-' || lpad(i::text, 12, '0'))::uuid, 'hist' || i, 'modifiers', 'H' FROM generate_series(10, 409) i;
INSERT INTO tasks (id, job_id, room_id, status, created_by_id, completed_at) SELECT gen_random_uuid(), ('00000000-0000-4000-8000-' || lpad((10 + i % 400)::text, 12, '0'))::uuid, 'hist', 'completed', '00000000-0000-4000-8000-000000000001', now() FROM generate_series(1, 20000) i;
ANALYZE;
