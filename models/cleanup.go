package models

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
)

// CleanupFence is the condition, re-checked under the worker's row lock, that
// must still hold for a worker to be cleaned. It is what makes racing callers
// (disconnect handler, sweeper, graceful delete, startup) safe: whichever locks
// the row first does the work, the others find the row gone or changed.
type CleanupFence struct {
	// StaleAfter, when positive, requires last_heartbeat < db now - StaleAfter.
	StaleAfter time.Duration
	// Epoch, when set, requires session_epoch = *Epoch (the socket session that
	// went away is still the worker's current one).
	Epoch *int64
	// NodeID and NodeRun, when NodeID is set, require the worker to be bound
	// to that node and to a run other than NodeRun (startup recovery).
	NodeID  string
	NodeRun string
	// SkipLocked skips workers another transaction is holding (PostgreSQL).
	SkipLocked bool
}

// CleanupAudit describes who cleans and why, for the cleanup_events rows.
type CleanupAudit struct {
	Path    string
	SweepID *uuid.UUID
}

// CleanedWorker is a worker a cleanup removed, with the evidence.
type CleanedWorker struct {
	Worker
	DBNow          Time
	TasksFailed    int
	TasksRequeued  int
	ProvidersGone  int
	ProviderRooms  []string
	FrameRooms     []string
	LinkedJobRooms []string
}

// CleanupOutcome is everything one cleanup transaction changed.
type CleanupOutcome struct {
	Workers []CleanedWorker
	// Tasks are the failed and requeued tasks as they are after the cleanup.
	Tasks []Task
	// OrphanJobs are the jobs soft-deleted because nothing serves them any more.
	OrphanJobs []Job
}

// Empty reports whether the cleanup found nothing to do.
func (o CleanupOutcome) Empty() bool { return len(o.Workers) == 0 }

// CleanupWorkers removes the given workers in one set-based pass: requeues
// (per job policy) or fails their claimed and running tasks, deletes their
// providers, links and rows, soft-deletes the jobs left orphaned and writes one
// audit row per worker. The statement count does not grow with len(ids).
// Workers whose fence no longer holds are left alone.
func (q *Q) CleanupWorkers(ids []uuid.UUID, f CleanupFence, lostError string, a CleanupAudit) (CleanupOutcome, error) {
	var out CleanupOutcome
	if len(ids) == 0 {
		return out, nil
	}
	where := []string{"w.id IN ?"}
	args := []any{ids}
	if f.StaleAfter > 0 {
		expr, arg := q.before(f.StaleAfter)
		where = append(where, "w.last_heartbeat < "+expr)
		args = append(args, arg)
	}
	if f.Epoch != nil {
		where = append(where, "w.session_epoch = ?")
		args = append(args, *f.Epoch)
	}
	if f.NodeID != "" {
		where = append(where, "w.node_id = ? AND w.node_run IS NOT NULL AND w.node_run <> ?")
		args = append(args, f.NodeID, f.NodeRun)
	}
	lock := ""
	if q.d == Postgres {
		lock = " FOR UPDATE OF w"
		if f.SkipLocked {
			lock += " SKIP LOCKED"
		}
	}
	var locked []struct {
		Worker
		DBNow Time
	}
	err := q.g.Raw("SELECT "+workerCols+", "+q.now()+" AS db_now FROM workers w WHERE "+strings.Join(where, " AND ")+" ORDER BY w.seq"+lock, args...).Scan(&locked).Error
	if err != nil {
		return out, fmt.Errorf("lock workers for cleanup: %w", mapErr(err))
	}
	if len(locked) == 0 {
		return out, nil
	}
	wids := make([]uuid.UUID, len(locked))
	byID := make(map[uuid.UUID]*CleanedWorker, len(locked))
	out.Workers = make([]CleanedWorker, len(locked))
	for i, l := range locked {
		wids[i] = l.ID
		out.Workers[i] = CleanedWorker{Worker: l.Worker, DBNow: l.DBNow}
		byID[l.ID] = &out.Workers[i]
	}

	type taskRow struct {
		ID           uuid.UUID
		LostWorkerID uuid.UUID
	}
	var requeued, failed []taskRow
	err = q.g.Raw("UPDATE tasks SET status = 'pending', lost_worker_id = worker_id, worker_id = NULL, claimed_at = NULL, started_at = NULL, updated_at = "+q.now()+
		" WHERE worker_id IN ? AND status IN ('claimed', 'running')"+
		" AND EXISTS (SELECT 1 FROM jobs j WHERE j.id = tasks.job_id AND j.on_worker_loss = 'requeue' AND tasks.attempt < j.max_attempts)"+
		" RETURNING id, lost_worker_id", wids).Scan(&requeued).Error
	if err != nil {
		return out, fmt.Errorf("requeue tasks of lost workers: %w", mapErr(err))
	}
	err = q.g.Raw("UPDATE tasks SET status = 'failed', completed_at = "+q.now()+", error = ?, lost_worker_id = worker_id, updated_at = "+q.now()+
		" WHERE worker_id IN ? AND status IN ('claimed', 'running') RETURNING id, lost_worker_id", lostError, wids).Scan(&failed).Error
	if err != nil {
		return out, fmt.Errorf("fail tasks of lost workers: %w", mapErr(err))
	}
	taskIDs := make([]uuid.UUID, 0, len(requeued)+len(failed))
	for _, r := range requeued {
		byID[r.LostWorkerID].TasksRequeued++
		taskIDs = append(taskIDs, r.ID)
	}
	for _, r := range failed {
		byID[r.LostWorkerID].TasksFailed++
		taskIDs = append(taskIDs, r.ID)
	}

	var links []struct {
		WorkerID uuid.UUID
		JobID    uuid.UUID
		RoomID   string
	}
	err = q.g.Raw("SELECT l.worker_id, l.job_id, j.room_id FROM worker_job_links l JOIN jobs j ON j.id = l.job_id WHERE l.worker_id IN ?", wids).Scan(&links).Error
	if err != nil {
		return out, fmt.Errorf("read links of lost workers: %w", mapErr(err))
	}
	var provs []struct {
		WorkerID uuid.UUID
		RoomID   string
		Category string
	}
	err = q.g.Raw("DELETE FROM providers WHERE worker_id IN ? RETURNING worker_id, room_id, category", wids).Scan(&provs).Error
	if err != nil {
		return out, fmt.Errorf("delete providers of lost workers: %w", mapErr(err))
	}
	if err := q.g.Exec("DELETE FROM worker_job_links WHERE worker_id IN ?", wids).Error; err != nil {
		return out, fmt.Errorf("delete links of lost workers: %w", mapErr(err))
	}
	if err := q.g.Exec("DELETE FROM workers WHERE id IN ?", wids).Error; err != nil {
		return out, fmt.Errorf("delete lost workers: %w", mapErr(err))
	}

	seenJob := map[uuid.UUID]bool{}
	var jobIDs []uuid.UUID
	for _, l := range links {
		w := byID[l.WorkerID]
		w.LinkedJobRooms = appendUnique(w.LinkedJobRooms, l.RoomID)
		if !seenJob[l.JobID] {
			seenJob[l.JobID] = true
			jobIDs = append(jobIDs, l.JobID)
		}
	}
	for _, p := range provs {
		w := byID[p.WorkerID]
		w.ProvidersGone++
		w.ProviderRooms = appendUnique(w.ProviderRooms, p.RoomID)
		if p.Category == "frames" {
			w.FrameRooms = appendUnique(w.FrameRooms, p.RoomID)
		}
	}
	if out.OrphanJobs, err = q.SoftDeleteOrphanJobs(jobIDs); err != nil {
		return out, err
	}
	if out.Tasks, err = q.GetTasks(taskIDs); err != nil {
		return out, err
	}
	if err := q.insertCleanupEvents(out, f, a); err != nil {
		return out, err
	}
	return out, nil
}

func (q *Q) insertCleanupEvents(out CleanupOutcome, f CleanupFence, a CleanupAudit) error {
	var threshold *int64
	if f.StaleAfter > 0 {
		ms := f.StaleAfter.Milliseconds()
		threshold = &ms
	}
	orphans := make([]string, len(out.OrphanJobs))
	for i, j := range out.OrphanJobs {
		orphans[i] = j.FullName()
	}
	const cols = 12
	var sb strings.Builder
	args := make([]any, 0, cols*len(out.Workers))
	sb.WriteString("INSERT INTO cleanup_events (id, sweep_id, path, worker_id, user_id, tasks_failed, tasks_requeued, providers, jobs_deleted, last_heartbeat, threshold_ms, detail, db_now, created_at) VALUES ")
	for i, w := range out.Workers {
		if i > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString("(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, " + q.now() + ", " + q.now() + ")")
		detail, _ := json.Marshal(map[string]any{
			"session_epoch": w.SessionEpoch,
			"node_id":       w.NodeID,
			"node_run":      w.NodeRun,
			"orphan_jobs":   orphans,
		})
		args = append(args, uuid.New(), a.SweepID, a.Path, w.ID, w.UserID, w.TasksFailed, w.TasksRequeued, w.ProvidersGone,
			len(out.OrphanJobs), w.LastHeartbeat, threshold, string(detail))
	}
	if err := q.g.Exec(sb.String(), args...).Error; err != nil {
		return fmt.Errorf("write cleanup audit: %w", mapErr(err))
	}
	return nil
}

func appendUnique(s []string, v string) []string {
	for _, x := range s {
		if x == v {
			return s
		}
	}
	return append(s, v)
}

// StaleWorkerIDs lists up to limit workers whose last heartbeat is older than
// timeout by the database's clock, stalest first.
func (q *Q) StaleWorkerIDs(timeout time.Duration, limit int) ([]uuid.UUID, error) {
	expr, arg := q.before(timeout)
	var ids []uuid.UUID
	err := q.g.Raw("SELECT id FROM workers WHERE last_heartbeat < "+expr+" ORDER BY last_heartbeat, seq LIMIT ?", arg, limit).Scan(&ids).Error
	if err != nil {
		return nil, fmt.Errorf("find stale workers: %w", mapErr(err))
	}
	return ids, nil
}

// FailStuckInternalTasks fails @internal tasks that have been claimed or
// running for longer than timeout (measured from started_at, or created_at if
// never started) and returns them.
func (q *Q) FailStuckInternalTasks(timeout time.Duration, lostError string) ([]Task, error) {
	expr, arg := q.before(timeout)
	var ids []uuid.UUID
	err := q.g.Raw("UPDATE tasks SET status = 'failed', completed_at = "+q.now()+", error = ?, updated_at = "+q.now()+
		" WHERE status IN ('claimed', 'running') AND job_id IN (SELECT id FROM jobs WHERE room_id = '@internal')"+
		" AND COALESCE(started_at, created_at) < "+expr+" RETURNING id", lostError, arg).Scan(&ids).Error
	if err != nil {
		return nil, fmt.Errorf("fail stuck internal tasks: %w", mapErr(err))
	}
	return q.GetTasks(ids)
}
