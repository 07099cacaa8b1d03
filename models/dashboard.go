package models

import (
	"fmt"
	"time"

	"github.com/google/uuid"
)

// The dashboard's reads. Each is bounded (a LIMIT, or a count over an
// index) so that one snapshot costs about the same whatever the size of the
// tasks and audit tables; the dashboard recomputes at most a few times a
// second, and only while somebody watches.

// DashWorker is a worker row as the dashboard shows it.
type DashWorker struct {
	ID            uuid.UUID
	UserID        uuid.UUID
	Owner         *string
	LastHeartbeat Time
	CreatedAt     Time
	SessionEpoch  int64
	NodeID        *string
	NodeRun       *string
	BoundAt       Time
	ActiveTasks   int64
}

// DashWorkers returns the newest limit workers with their owner's name and
// the number of tasks they hold, and the number of workers in all.
func (q *Q) DashWorkers(limit int) ([]DashWorker, int64, error) {
	var total int64
	if err := q.g.Raw("SELECT count(*) FROM workers").Scan(&total).Error; err != nil {
		return nil, 0, fmt.Errorf("count workers: %w", mapErr(err))
	}
	var ws []DashWorker
	err := q.g.Raw(`SELECT w.id, w.user_id, u.name AS owner, w.last_heartbeat, w.created_at, w.session_epoch, w.node_id, w.node_run, w.bound_at,
 (SELECT count(*) FROM tasks t WHERE t.worker_id = w.id AND t.status IN ('claimed', 'running')) AS active_tasks
 FROM workers w LEFT JOIN users u ON u.id = w.user_id ORDER BY w.created_at DESC, w.seq DESC LIMIT ?`, limit).Scan(&ws).Error
	if err != nil {
		return nil, 0, fmt.Errorf("list dashboard workers: %w", mapErr(err))
	}
	return ws, total, nil
}

// WorkerJobLink is one worker's link to a (live) job.
type WorkerJobLink struct {
	WorkerID uuid.UUID
	RoomID   string
	Category string
	Name     string
}

// DashWorkerJobs returns the live jobs linked to the given workers.
func (q *Q) DashWorkerJobs(ids []uuid.UUID) ([]WorkerJobLink, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	var out []WorkerJobLink
	err := q.g.Raw(`SELECT l.worker_id, j.room_id, j.category, j.name FROM worker_job_links l JOIN jobs j ON j.id = l.job_id
 WHERE l.worker_id IN ? AND j.deleted = false ORDER BY j.room_id, j.category, j.name`, ids).Scan(&out).Error
	if err != nil {
		return nil, fmt.Errorf("list worker jobs: %w", mapErr(err))
	}
	return out, nil
}

// DashJob is a live job with its workers and queue.
type DashJob struct {
	RoomID       string
	Category     string
	Name         string
	OnWorkerLoss string
	MaxAttempts  int
	Workers      int64
	Pending      int64
	Active       int64
}

// DashJobs returns up to limit live jobs with their worker count, queue
// length and held tasks (counts over the (job_id, status, seq) index).
func (q *Q) DashJobs(limit int) ([]DashJob, int64, error) {
	var total int64
	if err := q.g.Raw("SELECT count(*) FROM jobs WHERE deleted = false").Scan(&total).Error; err != nil {
		return nil, 0, fmt.Errorf("count jobs: %w", mapErr(err))
	}
	var out []DashJob
	err := q.g.Raw(`SELECT j.room_id, j.category, j.name, j.on_worker_loss, j.max_attempts,
 (SELECT count(*) FROM worker_job_links l WHERE l.job_id = j.id) AS workers,
 (SELECT count(*) FROM tasks t WHERE t.job_id = j.id AND t.status = 'pending') AS pending,
 (SELECT count(*) FROM tasks t WHERE t.job_id = j.id AND t.status IN ('claimed', 'running')) AS active
 FROM jobs j WHERE j.deleted = false ORDER BY j.room_id, j.category, j.name LIMIT ?`, limit).Scan(&out).Error
	if err != nil {
		return nil, 0, fmt.Errorf("list dashboard jobs: %w", mapErr(err))
	}
	return out, total, nil
}

// DashProvider is a provider with its owner's name.
type DashProvider struct {
	RoomID   string
	Category string
	Name     string
	WorkerID uuid.UUID
	Owner    *string
}

// DashProviders returns up to limit providers and their number.
func (q *Q) DashProviders(limit int) ([]DashProvider, int64, error) {
	var total int64
	if err := q.g.Raw("SELECT count(*) FROM providers").Scan(&total).Error; err != nil {
		return nil, 0, fmt.Errorf("count providers: %w", mapErr(err))
	}
	var out []DashProvider
	err := q.g.Raw(`SELECT p.room_id, p.category, p.name, p.worker_id, u.name AS owner FROM providers p
 LEFT JOIN users u ON u.id = p.user_id ORDER BY p.room_id, p.category, p.name LIMIT ?`, limit).Scan(&out).Error
	if err != nil {
		return nil, 0, fmt.Errorf("list dashboard providers: %w", mapErr(err))
	}
	return out, total, nil
}

// RoomStatusCount is the number of a room's tasks in one status.
type RoomStatusCount struct {
	RoomID string
	Status string
	N      int64
}

// DashRoomTaskCounts counts the tasks of each room in the statuses an
// operator acts on (pending, claimed, running, failed), over the status
// index: completed and cancelled tasks, the bulk of the table, are not read.
func (q *Q) DashRoomTaskCounts() ([]RoomStatusCount, error) {
	var out []RoomStatusCount
	err := q.g.Raw(`SELECT room_id, status, count(*) AS n FROM tasks WHERE status IN ('pending', 'claimed', 'running', 'failed')
 GROUP BY room_id, status ORDER BY room_id, status`).Scan(&out).Error
	if err != nil {
		return nil, fmt.Errorf("count room tasks: %w", mapErr(err))
	}
	return out, nil
}

// DashLatestTasks returns the newest limit tasks, with status (if not
// empty) only, newest first. Unlike the listings it does not rank queue
// positions (a pass over the pending tasks): the dashboard shows each job's
// queue length instead.
func (q *Q) DashLatestTasks(status string, limit int) ([]Task, error) {
	cond, args := "", []any{}
	if status != "" {
		cond = "WHERE t.status = ?"
		args = append(args, status)
	}
	var ts []Task
	err := q.g.Raw("SELECT "+taskCols+" FROM tasks t LEFT JOIN jobs j ON j.id = t.job_id "+cond+" ORDER BY t.seq DESC LIMIT ?", append(args, limit)...).Scan(&ts).Error
	if err != nil {
		return nil, fmt.Errorf("list latest tasks: %w", mapErr(err))
	}
	return ts, nil
}

// DashCleanup is a cleanup_events row with the owner's name.
type DashCleanup struct {
	CleanupEvent
	Owner *string
}

const dashCleanupCols = "ce.id, ce.seq, ce.sweep_id, ce.path, ce.worker_id, ce.user_id, ce.tasks_failed, ce.tasks_requeued, ce.providers, ce.jobs_deleted," +
	" ce.last_heartbeat, ce.db_now, ce.threshold_ms, ce.detail, ce.shadow, ce.heard_at, ce.heard_via, ce.created_at, u.name AS owner"

// DashCleanups returns the newest limit cleanup audit rows (shadow plans
// included), newest first.
func (q *Q) DashCleanups(limit int) ([]DashCleanup, error) {
	var out []DashCleanup
	err := q.g.Raw("SELECT "+dashCleanupCols+" FROM cleanup_events ce LEFT JOIN users u ON u.id = ce.user_id ORDER BY ce.seq DESC LIMIT ?", limit).Scan(&out).Error
	if err != nil {
		return nil, fmt.Errorf("list latest cleanups: %w", mapErr(err))
	}
	return out, nil
}

// DashFalsePositives returns the newest limit cleanups of the last window
// whose worker was heard from again, newest first, and how many there are.
func (q *Q) DashFalsePositives(window time.Duration, limit int) ([]DashCleanup, int64, error) {
	expr, arg := q.before(window)
	var n int64
	if err := q.g.Raw("SELECT count(*) FROM cleanup_events WHERE created_at > "+expr+" AND heard_at IS NOT NULL", arg).Scan(&n).Error; err != nil {
		return nil, 0, fmt.Errorf("count false positives: %w", mapErr(err))
	}
	if n == 0 {
		return nil, 0, nil
	}
	var out []DashCleanup
	err := q.g.Raw("SELECT "+dashCleanupCols+" FROM cleanup_events ce LEFT JOIN users u ON u.id = ce.user_id WHERE ce.created_at > "+expr+
		" AND ce.heard_at IS NOT NULL ORDER BY ce.seq DESC LIMIT ?", arg, limit).Scan(&out).Error
	if err != nil {
		return nil, 0, fmt.Errorf("list false positives: %w", mapErr(err))
	}
	return out, n, nil
}

// PathCount is a number of cleanups by path.
type PathCount struct {
	Path string
	N    int64
}

// DashCleanupCounts counts the (non-shadow) cleanups of the last window by
// path, over the created_at index.
func (q *Q) DashCleanupCounts(window time.Duration) ([]PathCount, error) {
	expr, arg := q.before(window)
	var out []PathCount
	err := q.g.Raw("SELECT path, count(*) AS n FROM cleanup_events WHERE created_at > "+expr+" AND shadow = ? GROUP BY path ORDER BY path", arg, false).Scan(&out).Error
	if err != nil {
		return nil, fmt.Errorf("count cleanups: %w", mapErr(err))
	}
	return out, nil
}
