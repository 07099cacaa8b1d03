package models

import (
	"fmt"
	"time"

	"github.com/google/uuid"
)

const (
	workerCols     = "w.id, w.user_id, w.last_heartbeat, w.created_at, w.session_epoch, w.node_id, w.node_run, w.bound_at"
	workerColsBare = "id, user_id, last_heartbeat, created_at, session_epoch, node_id, node_run, bound_at"
)

// InsertWorker creates a worker for a user with a fresh heartbeat.
func (q *Q) InsertWorker(userID uuid.UUID) (Worker, error) {
	var w Worker
	err := q.g.Raw("INSERT INTO workers (id, user_id, last_heartbeat, created_at) VALUES (?, ?, "+q.now()+", "+q.now()+") RETURNING "+workerColsBare,
		uuid.New(), userID).Scan(&w).Error
	if err != nil {
		return Worker{}, fmt.Errorf("insert worker: %w", mapErr(err))
	}
	return w, nil
}

// GetWorker reads one worker.
func (q *Q) GetWorker(id uuid.UUID) (Worker, error) {
	var ws []Worker
	if err := q.g.Raw("SELECT "+workerCols+" FROM workers w WHERE w.id = ?", id).Scan(&ws).Error; err != nil {
		return Worker{}, fmt.Errorf("read worker: %w", mapErr(err))
	}
	if len(ws) == 0 {
		return Worker{}, ErrNotFound
	}
	return ws[0], nil
}

// LockWorker reads one worker and, on PostgreSQL, holds a key-share lock on
// it until the transaction ends. A cleanup of the worker (which locks it FOR
// UPDATE) then either finished before (the worker is gone: ErrNotFound) or
// waits for this transaction and sees what it wrote, so nothing the
// transaction hands the worker can outlive it. Heartbeats are not blocked.
// On SQLite the single connection already serialises transactions.
func (q *Q) LockWorker(id uuid.UUID) (Worker, error) {
	lock := ""
	if q.d == Postgres {
		lock = " FOR KEY SHARE"
	}
	var ws []Worker
	if err := q.g.Raw("SELECT "+workerCols+" FROM workers w WHERE w.id = ?"+lock, id).Scan(&ws).Error; err != nil {
		return Worker{}, fmt.Errorf("lock worker: %w", mapErr(err))
	}
	if len(ws) == 0 {
		return Worker{}, ErrNotFound
	}
	return ws[0], nil
}

// TouchWorker sets a worker's last heartbeat to the database's now.
func (q *Q) TouchWorker(id uuid.UUID) (Worker, error) {
	var ws []Worker
	err := q.g.Raw("UPDATE workers SET last_heartbeat = "+q.now()+" WHERE id = ? RETURNING "+workerColsBare, id).Scan(&ws).Error
	if err != nil {
		return Worker{}, fmt.Errorf("heartbeat worker: %w", mapErr(err))
	}
	if len(ws) == 0 {
		return Worker{}, ErrNotFound
	}
	return ws[0], nil
}

// ExistingWorkers returns which of ids are workers.
func (q *Q) ExistingWorkers(ids []uuid.UUID) ([]uuid.UUID, error) {
	out := []uuid.UUID{}
	if len(ids) == 0 {
		return out, nil
	}
	if err := q.g.Raw("SELECT id FROM workers WHERE id IN ?", ids).Scan(&out).Error; err != nil {
		return nil, fmt.Errorf("existing workers: %w", mapErr(err))
	}
	return out, nil
}

// TouchWorkers refreshes the heartbeat of many workers whose sockets node
// run holds, in one statement, and returns how many rows it touched. It is
// fenced by the run's lease: a worker bound to another run since, or any
// worker once the run's lease has lapsed by the database's clock (the node
// stalled; a survivor may be releasing its sockets), is left alone. (A run
// whose row is gone was reaped: its workers were cleaned with it.)
func (q *Q) TouchWorkers(ids []uuid.UUID, run string) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	res := q.g.Exec("UPDATE workers SET last_heartbeat = "+q.now()+" WHERE id IN ? AND node_run = ?"+
		" AND NOT EXISTS (SELECT 1 FROM nodes n WHERE n.run = ? AND n.expires_at <= "+q.now()+")", ids, run, run)
	return res.RowsAffected, mapErr(res.Error)
}

const workerListCols = workerCols + ", (SELECT count(*) FROM worker_job_links l WHERE l.worker_id = w.id) AS job_count"

// ListWorkers pages through all workers, newest first.
func (q *Q) ListWorkers(p Page) ([]Worker, int64, error) {
	var total int64
	if err := q.g.Raw("SELECT count(*) FROM workers").Scan(&total).Error; err != nil {
		return nil, 0, fmt.Errorf("count workers: %w", mapErr(err))
	}
	ws := []Worker{}
	if p.Limit > 0 {
		err := q.g.Raw("SELECT "+workerListCols+" FROM workers w ORDER BY w.created_at DESC, w.seq DESC LIMIT ? OFFSET ?", p.Limit, p.Offset).Scan(&ws).Error
		if err != nil {
			return nil, 0, fmt.Errorf("list workers: %w", mapErr(err))
		}
	}
	return ws, total, nil
}

// ListWorkersForJobRooms pages through the distinct workers linked to any
// non-deleted job whose room is in rooms, newest first.
func (q *Q) ListWorkersForJobRooms(rooms []string, p Page) ([]Worker, int64, error) {
	const sel = "FROM workers w WHERE w.id IN (SELECT l.worker_id FROM worker_job_links l JOIN jobs j ON j.id = l.job_id WHERE j.deleted = false AND j.room_id IN ?)"
	var total int64
	if err := q.g.Raw("SELECT count(*) "+sel, rooms).Scan(&total).Error; err != nil {
		return nil, 0, fmt.Errorf("count room workers: %w", mapErr(err))
	}
	ws := []Worker{}
	if p.Limit > 0 {
		err := q.g.Raw("SELECT "+workerListCols+" "+sel+" ORDER BY w.created_at DESC, w.seq DESC LIMIT ? OFFSET ?", rooms, p.Limit, p.Offset).Scan(&ws).Error
		if err != nil {
			return nil, 0, fmt.Errorf("list room workers: %w", mapErr(err))
		}
	}
	return ws, total, nil
}

// BindWorker records that a worker's socket is held by nodeID's current run and
// starts a new session epoch. The returned epoch fences the disconnect path:
// a cleanup for an older epoch finds nothing to do.
func (q *Q) BindWorker(id uuid.UUID, nodeID, nodeRun string) (int64, error) {
	var epochs []int64
	err := q.g.Raw("UPDATE workers SET session_epoch = session_epoch + 1, node_id = ?, node_run = ?, bound_at = "+q.now()+", last_heartbeat = "+q.now()+
		" WHERE id = ? RETURNING session_epoch", nodeID, nodeRun, id).Scan(&epochs).Error
	if err != nil {
		return 0, fmt.Errorf("bind worker: %w", mapErr(err))
	}
	if len(epochs) == 0 {
		return 0, ErrNotFound
	}
	return epochs[0], nil
}

// SetHeartbeatAge moves the workers' last heartbeat to the database's now
// minus age. Tests and benchmarks use it to make workers stale without
// touching any clock; the server never calls it.
func (q *Q) SetHeartbeatAge(ids []uuid.UUID, age time.Duration) error {
	expr, arg := q.before(age)
	for start := 0; start < len(ids); start += MaxCleanupBatch {
		part := ids[start:min(start+MaxCleanupBatch, len(ids))]
		if err := q.g.Exec("UPDATE workers SET last_heartbeat = "+expr+" WHERE id IN ?", arg, part).Error; err != nil {
			return fmt.Errorf("set heartbeat age: %w", mapErr(err))
		}
	}
	return nil
}

// DBNow reads the database's clock.
func (q *Q) DBNow() (Time, error) {
	var t Time
	if err := q.g.Raw("SELECT " + q.now()).Row().Scan(&t); err != nil {
		return Time{}, fmt.Errorf("read database clock: %w", mapErr(err))
	}
	return t, nil
}
