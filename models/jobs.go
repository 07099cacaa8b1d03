package models

import (
	"fmt"

	"github.com/google/uuid"
)

const (
	jobCols     = "j.id, j.seq, j.room_id, j.category, j.name, j.schema, j.deleted, j.on_worker_loss, j.max_attempts, j.created_by_id, j.created_at, j.task_timeout, j.heartbeat_timeout, j.on_timeout, j.retry_backoff, j.retry_max_backoff"
	jobColsBare = "id, seq, room_id, category, name, schema, deleted, on_worker_loss, max_attempts, created_by_id, created_at, task_timeout, heartbeat_timeout, on_timeout, retry_backoff, retry_max_backoff"
)

// RowLock is how a read inside a transaction locks the rows it returns on
// PostgreSQL, so that it waits for (and then sees) a concurrent writer of
// those rows instead of acting on a stale version. SQLite's single
// connection serialises whole transactions, so it needs no row locks.
type RowLock string

const (
	// NoLock reads without locking.
	NoLock RowLock = ""
	// KeyShare keeps the row from being deleted or soft-deleted (the orphan
	// rule locks FOR UPDATE) until the transaction ends; it does not block
	// other readers, key-share lockers or ordinary updates.
	KeyShare RowLock = " FOR KEY SHARE"
	// NoKeyUpdate is for a read that is followed by an update of the row; it
	// also serialises with the orphan rule and with other such readers.
	NoKeyUpdate RowLock = " FOR NO KEY UPDATE"
)

func (q *Q) lock(l RowLock) string {
	if q.d == Postgres {
		return string(l)
	}
	return ""
}

// JobByKey finds a job by (room, category, name), soft-deleted ones included.
func (q *Q) JobByKey(room, category, name string) (Job, error) {
	return q.JobByKeyLocked(room, category, name, NoLock)
}

// JobByKeyLocked is JobByKey that also locks the row (see RowLock).
func (q *Q) JobByKeyLocked(room, category, name string, l RowLock) (Job, error) {
	var js []Job
	err := q.g.Raw("SELECT "+jobCols+" FROM jobs j WHERE j.room_id = ? AND j.category = ? AND j.name = ?"+q.lock(l), room, category, name).Scan(&js).Error
	if err != nil {
		return Job{}, fmt.Errorf("read job: %w", mapErr(err))
	}
	if len(js) == 0 {
		return Job{}, ErrNotFound
	}
	return js[0], nil
}

// InsertJobIfAbsent inserts a job unless one with the same key exists; it
// reports whether it inserted. Concurrent first registrations therefore never
// fail: exactly one inserts, the others find the row.
func (q *Q) InsertJobIfAbsent(j Job) (bool, error) {
	res := q.g.Exec("INSERT INTO jobs (id, room_id, category, name, schema, on_worker_loss, max_attempts, created_by_id, task_timeout, heartbeat_timeout, on_timeout, retry_backoff, retry_max_backoff, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "+q.now()+
		") ON CONFLICT (room_id, category, name) DO NOTHING",
		j.ID, j.RoomID, j.Category, j.Name, j.Schema, j.OnWorkerLoss, j.MaxAttempts, j.CreatedByID, j.TaskTimeout, j.HeartbeatTimeout, onTimeout(j.OnTimeout), j.RetryBackoff, j.RetryMaxBackoff)
	if res.Error != nil {
		return false, fmt.Errorf("insert job: %w", mapErr(res.Error))
	}
	return res.RowsAffected == 1, nil
}

// onTimeout is a job's timeout policy as stored ("" is the default, fail).
func onTimeout(p string) string {
	if p == "" {
		return "fail"
	}
	return p
}

// ReactivateJob turns a soft-deleted job live again with a new schema,
// policies (those of j) and creator. It reports false if the job was not
// deleted (a concurrent registration won).
func (q *Q) ReactivateJob(id uuid.UUID, schema string, j Job, createdBy *uuid.UUID) (bool, error) {
	res := q.g.Exec("UPDATE jobs SET deleted = false, deleted_at = NULL, schema = ?, on_worker_loss = ?, max_attempts = ?, created_by_id = ?,"+
		" task_timeout = ?, heartbeat_timeout = ?, on_timeout = ?, retry_backoff = ?, retry_max_backoff = ? WHERE id = ? AND deleted = true",
		schema, j.OnWorkerLoss, j.MaxAttempts, createdBy, j.TaskTimeout, j.HeartbeatTimeout, onTimeout(j.OnTimeout), j.RetryBackoff, j.RetryMaxBackoff, id)
	if res.Error != nil {
		return false, fmt.Errorf("reactivate job: %w", mapErr(res.Error))
	}
	return res.RowsAffected == 1, nil
}

// UpsertJobAlways creates or reactivates a job and overwrites its schema
// (internal jobs registered by the server itself).
func (q *Q) UpsertJobAlways(j Job) error {
	err := q.g.Exec("INSERT INTO jobs (id, room_id, category, name, schema, on_worker_loss, max_attempts, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, "+q.now()+
		") ON CONFLICT (room_id, category, name) DO UPDATE SET deleted = false, deleted_at = NULL, schema = excluded.schema",
		j.ID, j.RoomID, j.Category, j.Name, j.Schema, j.OnWorkerLoss, j.MaxAttempts).Error
	if err != nil {
		return fmt.Errorf("upsert job: %w", mapErr(err))
	}
	return nil
}

// LinkWorkerJob links a worker to a job; an existing link is kept.
func (q *Q) LinkWorkerJob(workerID, jobID uuid.UUID) error {
	err := q.g.Exec("INSERT INTO worker_job_links (worker_id, job_id) VALUES (?, ?) ON CONFLICT DO NOTHING", workerID, jobID).Error
	if err != nil {
		return fmt.Errorf("link worker to job: %w", mapErr(err))
	}
	return nil
}

// JobWorkerIDs returns the linked worker ids of each job.
func (q *Q) JobWorkerIDs(jobIDs []uuid.UUID) (map[uuid.UUID][]uuid.UUID, error) {
	out := make(map[uuid.UUID][]uuid.UUID, len(jobIDs))
	if len(jobIDs) == 0 {
		return out, nil
	}
	var rows []struct {
		JobID    uuid.UUID
		WorkerID uuid.UUID
	}
	err := q.g.Raw("SELECT l.job_id, l.worker_id FROM worker_job_links l JOIN workers w ON w.id = l.worker_id WHERE l.job_id IN ? ORDER BY w.seq", jobIDs).Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("read job workers: %w", mapErr(err))
	}
	for _, r := range rows {
		out[r.JobID] = append(out[r.JobID], r.WorkerID)
	}
	return out, nil
}

// ListJobs pages through the live jobs of the given rooms, newest first.
func (q *Q) ListJobs(rooms []string, p Page) ([]Job, int64, error) {
	var total int64
	if err := q.g.Raw("SELECT count(*) FROM jobs j WHERE j.deleted = false AND j.room_id IN ?", rooms).Scan(&total).Error; err != nil {
		return nil, 0, fmt.Errorf("count jobs: %w", mapErr(err))
	}
	js := []Job{}
	if p.Limit > 0 {
		err := q.g.Raw("SELECT "+jobCols+" FROM jobs j WHERE j.deleted = false AND j.room_id IN ? ORDER BY j.created_at DESC, j.seq DESC LIMIT ? OFFSET ?",
			rooms, p.Limit, p.Offset).Scan(&js).Error
		if err != nil {
			return nil, 0, fmt.Errorf("list jobs: %w", mapErr(err))
		}
	}
	return js, total, nil
}

// SoftDeleteOrphanJobs marks deleted every job among ids that is not
// @internal, has no worker link left and no pending task, and returns the
// deleted jobs. On PostgreSQL the candidate jobs are first locked FOR UPDATE,
// which waits for any transaction that is linking a worker to them or
// submitting a task (those hold the row in key-share or no-key-update mode);
// the conditions are then checked by a new statement, whose snapshot includes
// what those transactions committed. A job a concurrent registration or
// submission keeps alive is therefore never soft-deleted.
func (q *Q) SoftDeleteOrphanJobs(ids []uuid.UUID) ([]Job, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	if q.d == Postgres {
		var locked []uuid.UUID
		err := q.g.Raw("SELECT id FROM jobs WHERE id IN ? AND deleted = false AND room_id <> '@internal' ORDER BY id FOR UPDATE", ids).Scan(&locked).Error
		if err != nil {
			return nil, fmt.Errorf("lock orphan job candidates: %w", mapErr(err))
		}
		if len(locked) == 0 {
			return nil, nil
		}
		ids = locked
	}
	var js []Job
	err := q.g.Raw("UPDATE jobs SET deleted = true, deleted_at = "+q.now()+
		" WHERE id IN ? AND deleted = false AND room_id <> '@internal'"+
		" AND NOT EXISTS (SELECT 1 FROM worker_job_links l WHERE l.job_id = jobs.id)"+
		" AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.job_id = jobs.id AND t.status = 'pending')"+
		" RETURNING "+jobColsBare, ids).Scan(&js).Error
	if err != nil {
		return nil, fmt.Errorf("soft-delete orphan jobs: %w", mapErr(err))
	}
	return js, nil
}

// SetJobPolicy changes a job's worker-loss policy.
func (q *Q) SetJobPolicy(id uuid.UUID, onWorkerLoss string, maxAttempts int) error {
	err := q.g.Exec("UPDATE jobs SET on_worker_loss = ?, max_attempts = ? WHERE id = ?", onWorkerLoss, maxAttempts, id).Error
	if err != nil {
		return fmt.Errorf("set job policy: %w", mapErr(err))
	}
	return nil
}

// SetJobRetry changes a job's retry policy (seconds; nil backoff: none)
// and its max_attempts.
func (q *Q) SetJobRetry(id uuid.UUID, backoff, maxBackoff *float64, maxAttempts int) error {
	err := q.g.Exec("UPDATE jobs SET retry_backoff = ?, retry_max_backoff = ?, max_attempts = ? WHERE id = ?", backoff, maxBackoff, maxAttempts, id).Error
	if err != nil {
		return fmt.Errorf("set job retry: %w", mapErr(err))
	}
	return nil
}

// SetJobTimeouts changes a job's task limits (seconds, nil: none) and
// timeout policy. Tasks already submitted keep the limits they were
// submitted with.
func (q *Q) SetJobTimeouts(id uuid.UUID, taskTimeout, heartbeatTimeout *int, policy string) error {
	err := q.g.Exec("UPDATE jobs SET task_timeout = ?, heartbeat_timeout = ?, on_timeout = ? WHERE id = ?", taskTimeout, heartbeatTimeout, onTimeout(policy), id).Error
	if err != nil {
		return fmt.Errorf("set job timeouts: %w", mapErr(err))
	}
	return nil
}

// SetJobDeleted sets a job's soft-delete flag directly (operators; tests of
// reactivation for @internal jobs, which the orphan rule never deletes).
func (q *Q) SetJobDeleted(id uuid.UUID, deleted bool) error {
	err := q.g.Exec("UPDATE jobs SET deleted = ?, deleted_at = CASE WHEN ? THEN "+q.now()+" ELSE NULL END WHERE id = ?", deleted, deleted, id).Error
	if err != nil {
		return fmt.Errorf("set job deleted: %w", mapErr(err))
	}
	return nil
}
