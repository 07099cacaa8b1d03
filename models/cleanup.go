package models

import (
	"cmp"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
)

// MaxCleanupBatch is the most workers one cleanup statement set takes. It
// keeps every statement's bound parameters under both databases' limits
// (PostgreSQL 65535, SQLite 32766) and bounds how long row locks are held.
const MaxCleanupBatch = 1000

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
	// LostRun, when set, requires the worker to be bound to that node run
	// and the run's lease to have lapsed more than LostGrace ago (node loss:
	// its sockets count as closed when the lease lapsed; a worker that
	// re-joined elsewhere since is bound to another run).
	LostRun   string
	LostGrace time.Duration
	// SkipLocked skips workers another transaction is holding (PostgreSQL).
	SkipLocked bool
	// Leader, when set, requires the leadership lease to still be held with
	// this epoch (the sweeper's and node reaping's cleanups): a leader that
	// lost its lease while paused cleans nothing.
	Leader LeaderFence
}

// CleanupAudit describes who cleans and why, for the cleanup_events rows.
type CleanupAudit struct {
	Path    string
	SweepID *uuid.UUID
}

// CleanedWorker is a worker a cleanup removed, with the evidence.
type CleanedWorker struct {
	Worker
	// DBNow is the database's clock when the worker was locked for cleanup:
	// the moment of the decision, against which LastHeartbeat is judged.
	DBNow          Time
	TasksFailed    int
	TasksRequeued  int
	ProvidersGone  int
	ProviderRooms  []string
	FrameRooms     []string
	LinkedJobRooms []string
	// FailedTaskIDs and RequeuedTaskIDs are the tasks it lost.
	FailedTaskIDs   []uuid.UUID
	RequeuedTaskIDs []uuid.UUID
	// OrphanJobs are the full names of the jobs soft-deleted because this
	// worker (with the others of its batch) was their last one.
	OrphanJobs []string
	linkedJobs []uuid.UUID
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

// CleanupWorkers removes the given workers (at most MaxCleanupBatch) in one
// set-based pass: requeues (per job policy) or fails their claimed and running
// tasks, deletes their providers, links and rows, soft-deletes the jobs left
// orphaned and writes one audit row per worker. The statement count does not
// grow with len(ids). Workers whose fence no longer holds are left alone.
func (q *Q) CleanupWorkers(ids []uuid.UUID, f CleanupFence, lostError string, a CleanupAudit) (CleanupOutcome, error) {
	if len(ids) == 0 {
		return CleanupOutcome{}, nil
	}
	if len(ids) > MaxCleanupBatch {
		return CleanupOutcome{}, fmt.Errorf("cleanup of %d workers: at most %d per batch", len(ids), MaxCleanupBatch)
	}
	return q.cleanup(ids, 0, f, lostError, a)
}

// CleanupMatching is CleanupWorkers for the first limit workers (at most
// MaxCleanupBatch, oldest first) that satisfy the fence, found and locked by
// the same statement. The fence must select by staleness or by node: it never
// cleans every worker.
func (q *Q) CleanupMatching(f CleanupFence, limit int, lostError string, a CleanupAudit) (CleanupOutcome, error) {
	if f.StaleAfter <= 0 && f.NodeID == "" && f.LostRun == "" {
		return CleanupOutcome{}, errors.New("cleanup matching: the fence selects every worker")
	}
	if limit <= 0 || limit > MaxCleanupBatch {
		return CleanupOutcome{}, fmt.Errorf("cleanup matching: limit %d not in 1..%d", limit, MaxCleanupBatch)
	}
	return q.cleanup(nil, limit, f, lostError, a)
}

func (q *Q) cleanup(ids []uuid.UUID, limit int, f CleanupFence, lostError string, a CleanupAudit) (CleanupOutcome, error) {
	var out CleanupOutcome
	var where []string
	var args []any
	if ids != nil {
		frag, arg := q.inIDs("w.id", ids)
		where = append(where, frag)
		args = append(args, arg)
	}
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
		// Never a run whose lease is live: that process is running.
		where = append(where, "w.node_id = ? AND w.node_run IS NOT NULL AND w.node_run <> ?"+
			" AND NOT EXISTS (SELECT 1 FROM nodes n WHERE n.run = w.node_run AND n.expires_at > "+q.now()+")")
		args = append(args, f.NodeID, f.NodeRun)
	}
	if f.LostRun != "" {
		expr, arg := q.before(f.LostGrace)
		where = append(where, "w.node_run = ? AND EXISTS (SELECT 1 FROM nodes n WHERE n.run = w.node_run AND n.expires_at < "+expr+")")
		args = append(args, f.LostRun, arg)
	}
	if cond, cargs := q.leaderCond(f.Leader); cond != "" {
		where = append(where, cond)
		args = append(args, cargs...)
	}
	tail := " ORDER BY w.seq"
	if limit > 0 {
		tail += " LIMIT ?"
		args = append(args, limit)
	}
	if q.d == Postgres {
		tail += " FOR UPDATE OF w"
		if f.SkipLocked {
			tail += " SKIP LOCKED"
		}
	}
	var locked []struct {
		Worker
		DBNow Time
	}
	err := q.g.Raw("SELECT "+workerCols+", "+q.now()+" AS db_now FROM workers w WHERE "+strings.Join(where, " AND ")+tail, args...).Scan(&locked).Error
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

	lost, err := q.releaseTasks(wids, lostError)
	if err != nil {
		return out, err
	}
	for _, t := range lost {
		w := byID[*t.LostWorkerID]
		if t.Status == StatusPending {
			w.TasksRequeued++
			w.RequeuedTaskIDs = append(w.RequeuedTaskIDs, t.ID)
		} else {
			w.TasksFailed++
			w.FailedTaskIDs = append(w.FailedTaskIDs, t.ID)
		}
	}
	out.Tasks = lost

	var links []struct {
		WorkerID uuid.UUID
		JobID    uuid.UUID
		RoomID   string
	}
	inLinks, widsArg := q.inIDs("l.worker_id", wids)
	err = q.g.Raw("SELECT l.worker_id, l.job_id, j.room_id FROM worker_job_links l JOIN jobs j ON j.id = l.job_id WHERE "+inLinks, widsArg).Scan(&links).Error
	if err != nil {
		return out, fmt.Errorf("read links of lost workers: %w", mapErr(err))
	}
	var provs []struct {
		WorkerID uuid.UUID
		RoomID   string
		Category string
	}
	inWorker, _ := q.inIDs("worker_id", wids)
	err = q.g.Raw("DELETE FROM providers WHERE "+inWorker+" RETURNING worker_id, room_id, category", widsArg).Scan(&provs).Error
	if err != nil {
		return out, fmt.Errorf("delete providers of lost workers: %w", mapErr(err))
	}
	if err := q.g.Exec("DELETE FROM worker_job_links WHERE "+inWorker, widsArg).Error; err != nil {
		return out, fmt.Errorf("delete links of lost workers: %w", mapErr(err))
	}
	inID, _ := q.inIDs("id", wids)
	if err := q.g.Exec("DELETE FROM workers WHERE "+inID, widsArg).Error; err != nil {
		return out, fmt.Errorf("delete lost workers: %w", mapErr(err))
	}

	seenJob := map[uuid.UUID]bool{}
	var jobIDs []uuid.UUID
	for _, l := range links {
		w := byID[l.WorkerID]
		w.LinkedJobRooms = appendUnique(w.LinkedJobRooms, l.RoomID)
		w.linkedJobs = append(w.linkedJobs, l.JobID)
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
	orphanName := make(map[uuid.UUID]string, len(out.OrphanJobs))
	for _, j := range out.OrphanJobs {
		orphanName[j.ID] = j.FullName()
	}
	for i := range out.Workers {
		w := &out.Workers[i]
		for _, j := range w.linkedJobs {
			if n, ok := orphanName[j]; ok {
				w.OrphanJobs = append(w.OrphanJobs, n)
			}
		}
	}
	if err := q.insertCleanupEvents(out, f, a, false); err != nil {
		return out, err
	}
	return out, nil
}

// releaseTask's SET clauses: a task of a job whose policy is requeue, with
// attempts left, goes back to pending (worker, claim and start cleared);
// every other task fails with the error. The worker is kept as
// lost_worker_id either way.
const releaseRequeue = "(j.on_worker_loss = 'requeue' AND tasks.attempt < j.max_attempts)"

// releaseTasks requeues or fails, per job policy, the claimed and running
// tasks of the given workers in one statement and returns them as they are
// after it (requeued tasks with their queue position), in seq order.
func (q *Q) releaseTasks(wids []uuid.UUID, lostError string) ([]Task, error) {
	now := q.now()
	set := "status = CASE WHEN " + releaseRequeue + " THEN 'pending' ELSE 'failed' END" +
		", lost_worker_id = tasks.worker_id" +
		", worker_id = CASE WHEN " + releaseRequeue + " THEN NULL ELSE tasks.worker_id END" +
		", claimed_at = CASE WHEN " + releaseRequeue + " THEN NULL ELSE tasks.claimed_at END" +
		", started_at = CASE WHEN " + releaseRequeue + " THEN NULL ELSE tasks.started_at END" +
		", completed_at = CASE WHEN " + releaseRequeue + " THEN tasks.completed_at ELSE " + now + " END" +
		", error = CASE WHEN " + releaseRequeue + " THEN tasks.error ELSE ? END" +
		", updated_at = " + now
	ret := "tasks.id, tasks.seq, tasks.job_id, tasks.worker_id, tasks.lost_worker_id, tasks.room_id, tasks.created_by_id, tasks.payload, tasks.status, tasks.attempt," +
		" tasks.created_at, tasks.claimed_at, tasks.started_at, tasks.completed_at, tasks.error, tasks.result"
	if q.d == Postgres {
		// PostgreSQL returns the job's columns with the task; SQLite's
		// RETURNING may not name the FROM table, so they are read below.
		ret += ", j.room_id AS job_room, j.category AS job_category, j.name AS job_name, j.on_worker_loss, j.max_attempts"
	} else {
		ret = strings.ReplaceAll(ret, "tasks.", "")
	}
	inWorker, widsArg := q.inIDs("tasks.worker_id", wids)
	rows, err := q.g.Raw("UPDATE tasks SET "+set+" FROM jobs j WHERE j.id = tasks.job_id AND "+inWorker+" AND tasks.status IN ('claimed', 'running') RETURNING "+ret,
		lostError, widsArg).Rows()
	if err != nil {
		return nil, fmt.Errorf("release tasks of lost workers: %w", mapErr(err))
	}
	// Scanned by hand: a sweep returns tens of thousands of rows, and
	// gorm's reflection was most of the client's time. Every column is
	// scanned into t for each row (a pointer column gets a new value or
	// nil), so t and dest serve every row; the slice doubles as it grows
	// (append grows a large slice by a quarter, copying 440-byte tasks
	// each time).
	var (
		ts []Task
		t  Task
	)
	dest := []any{&t.ID, &t.Seq, &t.JobID, &t.WorkerID, &t.LostWorkerID, &t.RoomID, &t.CreatedByID, &t.Payload, &t.Status, &t.Attempt,
		&t.CreatedAt, &t.ClaimedAt, &t.StartedAt, &t.CompletedAt, &t.Error, &t.Result}
	if q.d == Postgres {
		dest = append(dest, &t.JobRoom, &t.JobCategory, &t.JobName, &t.OnWorkerLoss, &t.MaxAttempts)
	}
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read released tasks: %w", mapErr(err))
		}
		if len(ts) == cap(ts) {
			ts = slices.Grow(ts, max(len(ts), len(wids)))
		}
		ts = append(ts, t)
	}
	if err := rows.Close(); err != nil {
		return nil, fmt.Errorf("release tasks of lost workers: %w", mapErr(err))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("release tasks of lost workers: %w", mapErr(err))
	}
	if len(ts) == 0 {
		return nil, nil
	}
	if q.d != Postgres {
		if err := q.fillTaskJobs(ts); err != nil {
			return nil, err
		}
	}
	// A requeued task's status event carries its queue position.
	var requeued []uuid.UUID
	for _, t := range ts {
		if t.Status == StatusPending {
			requeued = append(requeued, t.ID)
		}
	}
	if len(requeued) > 0 {
		ranked, err := q.GetTasks(requeued)
		if err != nil {
			return nil, err
		}
		pos := make(map[uuid.UUID]*int64, len(ranked))
		for _, r := range ranked {
			pos[r.ID] = r.QueuePosition
		}
		for i := range ts {
			if ts[i].Status == StatusPending {
				ts[i].QueuePosition = pos[ts[i].ID]
			}
		}
	}
	slices.SortFunc(ts, func(a, b Task) int { return cmp.Compare(a.Seq, b.Seq) })
	return ts, nil
}

// fillTaskJobs sets the job columns of tasks read without them, with one
// query for their distinct jobs.
func (q *Q) fillTaskJobs(ts []Task) error {
	seen := map[uuid.UUID]bool{}
	var ids []uuid.UUID
	for _, t := range ts {
		if !seen[t.JobID] {
			seen[t.JobID] = true
			ids = append(ids, t.JobID)
		}
	}
	var js []struct {
		ID           uuid.UUID
		RoomID       string
		Category     string
		Name         string
		OnWorkerLoss string
		MaxAttempts  int
	}
	if err := q.g.Raw("SELECT id, room_id, category, name, on_worker_loss, max_attempts FROM jobs WHERE id IN ?", ids).Scan(&js).Error; err != nil {
		return fmt.Errorf("read jobs of released tasks: %w", mapErr(err))
	}
	byID := make(map[uuid.UUID]int, len(js))
	for i := range js {
		byID[js[i].ID] = i
	}
	for k := range ts {
		if i, ok := byID[ts[k].JobID]; ok {
			j := &js[i]
			ts[k].JobRoom, ts[k].JobCategory, ts[k].JobName = &j.RoomID, &j.Category, &j.Name
			ts[k].OnWorkerLoss, ts[k].MaxAttempts = &j.OnWorkerLoss, &j.MaxAttempts
		}
	}
	return nil
}

// RecordShadowCleanup writes the audit rows of a cleanup that was planned
// but not carried out (the sweep's blast-radius cap held it back), marked
// shadow so they never count as a cleanup.
func (q *Q) RecordShadowCleanup(out CleanupOutcome, f CleanupFence, a CleanupAudit) error {
	return q.insertCleanupEvents(out, f, a, true)
}

// maxDetailTasks bounds the task ids one audit row lists.
const maxDetailTasks = 100

func (q *Q) insertCleanupEvents(out CleanupOutcome, f CleanupFence, a CleanupAudit, shadow bool) error {
	if len(out.Workers) == 0 {
		return nil
	}
	var threshold *int64
	if f.StaleAfter > 0 {
		ms := f.StaleAfter.Milliseconds()
		threshold = &ms
	}
	// The rows travel as one JSON parameter: one statement of constant
	// shape, whatever the batch size (no per-row bound parameters to encode
	// and bind, and one cached plan).
	type row struct {
		ID            uuid.UUID `json:"id"`
		WorkerID      uuid.UUID `json:"worker_id"`
		UserID        uuid.UUID `json:"user_id"`
		TasksFailed   int       `json:"tasks_failed"`
		TasksRequeued int       `json:"tasks_requeued"`
		Providers     int       `json:"providers"`
		JobsDeleted   int       `json:"jobs_deleted"`
		LastHeartbeat any       `json:"last_heartbeat"`
		Detail        string    `json:"detail"`
		DBNow         any       `json:"db_now"`
	}
	rows := make([]row, len(out.Workers))
	for i, w := range out.Workers {
		detail := map[string]any{
			"session_epoch":  w.SessionEpoch,
			"node_id":        w.NodeID,
			"node_run":       w.NodeRun,
			"orphan_jobs":    nonNil(w.OrphanJobs),
			"failed_tasks":   capIDs(w.FailedTaskIDs),
			"requeued_tasks": capIDs(w.RequeuedTaskIDs),
		}
		if f.Epoch != nil {
			detail["fence_epoch"] = *f.Epoch
		}
		if f.NodeID != "" {
			detail["fence_node_run"] = f.NodeRun
		}
		b, err := json.Marshal(detail)
		if err != nil {
			return fmt.Errorf("encode cleanup audit detail: %w", err)
		}
		// Timestamps in the form Time writes (SQLite's stored text).
		hb, _ := w.LastHeartbeat.Value()
		now, _ := w.DBNow.Value()
		rows[i] = row{ID: uuid.New(), WorkerID: w.ID, UserID: w.UserID, TasksFailed: w.TasksFailed, TasksRequeued: w.TasksRequeued,
			Providers: w.ProvidersGone, JobsDeleted: len(w.OrphanJobs), LastHeartbeat: hb, Detail: string(b), DBNow: now}
	}
	payload, err := json.Marshal(rows)
	if err != nil {
		return fmt.Errorf("encode cleanup audit: %w", err)
	}
	cols := "INSERT INTO cleanup_events (id, sweep_id, path, worker_id, user_id, tasks_failed, tasks_requeued, providers, jobs_deleted, last_heartbeat, threshold_ms, detail, db_now, shadow, created_at) "
	var stmt string
	if q.d == Postgres {
		stmt = cols + "SELECT r.id, ?::uuid, ?, r.worker_id, r.user_id, r.tasks_failed, r.tasks_requeued, r.providers, r.jobs_deleted, r.last_heartbeat, ?::bigint, r.detail, r.db_now, ?, now()" +
			" FROM json_to_recordset(?::json) AS r(id uuid, worker_id uuid, user_id uuid, tasks_failed int, tasks_requeued int, providers int, jobs_deleted int, last_heartbeat timestamptz, detail text, db_now timestamptz)"
	} else {
		stmt = cols + "SELECT value->>'id', ?, ?, value->>'worker_id', value->>'user_id', value->>'tasks_failed', value->>'tasks_requeued', value->>'providers', value->>'jobs_deleted'," +
			" value->>'last_heartbeat', ?, value->>'detail', value->>'db_now', ?, " + q.now() + " FROM json_each(?)"
	}
	if err := q.g.Exec(stmt, a.SweepID, a.Path, threshold, shadow, string(payload)).Error; err != nil {
		return fmt.Errorf("write cleanup audit: %w", mapErr(err))
	}
	return nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func capIDs(ids []uuid.UUID) []uuid.UUID {
	if ids == nil {
		return []uuid.UUID{}
	}
	return ids[:min(len(ids), maxDetailTasks)]
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

// CountWorkers counts all workers and those whose last heartbeat is older than
// timeout by the database's clock, in one statement.
func (q *Q) CountWorkers(timeout time.Duration) (stale, total int64, err error) {
	expr, arg := q.before(timeout)
	var row struct {
		Stale int64
		Total int64
	}
	err = q.g.Raw("SELECT COALESCE(SUM(CASE WHEN last_heartbeat < "+expr+" THEN 1 ELSE 0 END), 0) AS stale, count(*) AS total FROM workers", arg).Scan(&row).Error
	if err != nil {
		return 0, 0, fmt.Errorf("count workers: %w", mapErr(err))
	}
	return row.Stale, row.Total, nil
}

// SweepProbe says whether a sweep has anything to do.
type SweepProbe struct {
	// Stale: some worker's last heartbeat is older than the threshold.
	Stale bool
	// Stuck: some @internal task is claimed or running for longer than
	// the internal task timeout (FailStuckInternalTasks would fail it).
	Stuck bool
	// TimedOut: some claimed or running task is past its deadline
	// (TimeOutTasks would time it out).
	TimedOut bool
}

// earliestDeadlineSQL is the earliest deadline of a held task: the first
// entry of the partial index tasks_deadline_idx. It is written as ORDER BY
// ... LIMIT 1 rather than min(): with few held tasks PostgreSQL's statistics
// may turn min() into an aggregate over the whole index, and SQLite sorts
// NULLs (held tasks without limits) first.
const earliestDeadlineSQL = "SELECT t.deadline_at FROM tasks t WHERE t.status IN ('claimed', 'running') AND t.deadline_at IS NOT NULL ORDER BY t.deadline_at LIMIT 1"

// ProbeSweep answers SweepProbe in one read-only statement, so an idle
// sweep costs one round trip. Both tests compare a minimum with the
// threshold, so the plan never depends on the threshold's value: the oldest
// heartbeat is the first entry of the index on last_heartbeat, and the
// oldest claimed or running @internal task is found per @internal job on the
// (job_id, status, seq) index; the earliest deadline of a held task is the
// first entry of the partial index on deadline_at. (An EXISTS with the threshold in its WHERE
// clause gets a generic plan that scans every worker when none is stale.)
func (q *Q) ProbeSweep(staleAfter, internalTimeout time.Duration) (SweepProbe, error) {
	staleExpr, staleArg := q.before(staleAfter)
	stuckExpr, stuckArg := q.before(internalTimeout)
	var p SweepProbe
	err := q.g.Raw("SELECT COALESCE((SELECT min(last_heartbeat) FROM workers) < "+staleExpr+", false) AS stale,"+
		" COALESCE((SELECT min((SELECT min(COALESCE(t.started_at, t.created_at)) FROM tasks t WHERE t.job_id = j.id AND t.status IN ('claimed', 'running')))"+
		" FROM jobs j WHERE j.room_id = '@internal') < "+stuckExpr+", false) AS stuck,"+
		" COALESCE(("+earliestDeadlineSQL+") < "+q.now()+", false) AS timed_out", staleArg, stuckArg).Scan(&p).Error
	if err != nil {
		return p, fmt.Errorf("probe sweep: %w", mapErr(err))
	}
	return p, nil
}

// FailStuckInternalTasks fails @internal tasks that have been claimed or
// running for longer than timeout (measured from started_at, or created_at if
// never started) and returns them. lead fences it to the sweeper leader
// (zero: unfenced).
func (q *Q) FailStuckInternalTasks(timeout time.Duration, lostError string, lead LeaderFence) ([]Task, error) {
	expr, arg := q.before(timeout)
	var ids []uuid.UUID
	where, args := q.andLeader(" WHERE status IN ('claimed', 'running') AND job_id IN (SELECT id FROM jobs WHERE room_id = '@internal')"+
		" AND COALESCE(started_at, created_at) < "+expr, []any{lostError, arg}, lead)
	err := q.g.Raw("UPDATE tasks SET status = 'failed', completed_at = "+q.now()+", error = ?, updated_at = "+q.now()+
		where+" RETURNING id", args...).Scan(&ids).Error
	if err != nil {
		return nil, fmt.Errorf("fail stuck internal tasks: %w", mapErr(err))
	}
	return q.GetTasks(ids)
}

// ReapRecord is the audit of a worker removed by a cleanup, as a later
// request from its owner finds it.
type ReapRecord struct {
	WorkerID      uuid.UUID
	Path          string
	SweepID       *uuid.UUID
	LastHeartbeat Time
	DBNow         Time
	HeardAt       Time
}

const reapCols = "worker_id, path, sweep_id, last_heartbeat, db_now, heard_at"

// ReapedWorker finds the (non-shadow) audit row of a worker that a cleanup
// other than a graceful delete removed and that belonged to userID.
func (q *Q) ReapedWorker(workerID, userID uuid.UUID) (ReapRecord, bool, error) {
	var rs []ReapRecord
	err := q.g.Raw("SELECT "+reapCols+" FROM cleanup_events WHERE worker_id = ? AND user_id = ? AND shadow = ? AND path <> 'graceful' ORDER BY seq LIMIT 1",
		workerID, userID, false).Scan(&rs).Error
	if err != nil {
		return ReapRecord{}, false, fmt.Errorf("read cleanup audit of worker: %w", mapErr(err))
	}
	if len(rs) == 0 {
		return ReapRecord{}, false, nil
	}
	return rs[0], true, nil
}

// MarkWorkerHeard records that a worker a cleanup removed (other than by a
// graceful delete) was heard from again by its owner: a false positive. It
// reports true only the first time, so each reaped worker counts once.
func (q *Q) MarkWorkerHeard(workerID, userID uuid.UUID, via string) (ReapRecord, bool, error) {
	var rs []ReapRecord
	err := q.g.Raw("UPDATE cleanup_events SET heard_at = "+q.now()+", heard_via = ? WHERE worker_id = ? AND user_id = ? AND shadow = ? AND path <> 'graceful' AND heard_at IS NULL RETURNING "+reapCols,
		via, workerID, userID, false).Scan(&rs).Error
	if err != nil {
		return ReapRecord{}, false, fmt.Errorf("record false positive: %w", mapErr(err))
	}
	if len(rs) == 0 {
		return ReapRecord{}, false, nil
	}
	return rs[0], true, nil
}

// PurgeAudit deletes up to limit cleanup_events and up to limit audit_log
// rows older than retention by the database's clock and returns how many.
func (q *Q) PurgeAudit(retention time.Duration, limit int, lead LeaderFence) (int64, error) {
	var n int64
	for _, table := range []string{"cleanup_events", "audit_log"} {
		expr, arg := q.before(retention)
		where, args := q.andLeader(" WHERE created_at < "+expr, []any{arg}, lead)
		res := q.g.Exec("DELETE FROM "+table+" WHERE seq IN (SELECT seq FROM "+table+where+" ORDER BY seq LIMIT ?)", append(args, limit)...)
		if res.Error != nil {
			return n, fmt.Errorf("purge %s: %w", table, mapErr(res.Error))
		}
		n += res.RowsAffected
	}
	return n, nil
}

// CleanupEvent is one row of the cleanup audit trail.
type CleanupEvent struct {
	ID            uuid.UUID
	Seq           int64
	SweepID       *uuid.UUID
	Path          string
	WorkerID      uuid.UUID
	UserID        *uuid.UUID
	TasksFailed   int
	TasksRequeued int
	Providers     int
	JobsDeleted   int
	LastHeartbeat Time
	DBNow         Time
	ThresholdMs   *int64
	Detail        string
	Shadow        bool
	HeardAt       Time
	HeardVia      *string
	CreatedAt     Time
}

// CleanupEventFilter selects audit rows; zero fields match everything.
type CleanupEventFilter struct {
	WorkerID *uuid.UUID
	SweepID  *uuid.UUID
	Path     string
}

// ListCleanupEvents returns audit rows, oldest first, at most limit.
func (q *Q) ListCleanupEvents(f CleanupEventFilter, limit int) ([]CleanupEvent, error) {
	where := []string{"1 = 1"}
	var args []any
	if f.WorkerID != nil {
		where = append(where, "worker_id = ?")
		args = append(args, *f.WorkerID)
	}
	if f.SweepID != nil {
		where = append(where, "sweep_id = ?")
		args = append(args, *f.SweepID)
	}
	if f.Path != "" {
		where = append(where, "path = ?")
		args = append(args, f.Path)
	}
	args = append(args, limit)
	var es []CleanupEvent
	err := q.g.Raw("SELECT id, seq, sweep_id, path, worker_id, user_id, tasks_failed, tasks_requeued, providers, jobs_deleted, last_heartbeat, db_now, threshold_ms, detail, shadow, heard_at, heard_via, created_at"+
		" FROM cleanup_events WHERE "+strings.Join(where, " AND ")+" ORDER BY seq LIMIT ?", args...).Scan(&es).Error
	if err != nil {
		return nil, fmt.Errorf("list cleanup events: %w", mapErr(err))
	}
	return es, nil
}

// inIDs is the condition "col is one of ids" and its one argument. On
// PostgreSQL the ids travel as one uuid[] parameter (= ANY): a statement of
// one shape whatever the batch, with one parameter to encode and bind
// instead of hundreds. SQLite gets an IN list.
func (q *Q) inIDs(col string, ids []uuid.UUID) (string, any) {
	if q.d == Postgres {
		return col + " = ANY(?::uuid[])", uuidArray(ids)
	}
	return col + " IN ?", ids
}

// uuidArray is a PostgreSQL uuid[] parameter, sent as its text form. It is
// a struct so that gorm binds it as one value rather than expanding a slice.
type uuidArrayValue struct{ ids []uuid.UUID }

func uuidArray(ids []uuid.UUID) uuidArrayValue { return uuidArrayValue{ids} }

// Value renders {id,id,...}.
func (a uuidArrayValue) Value() (driver.Value, error) {
	b := make([]byte, 0, 2+37*len(a.ids))
	b = append(b, '{')
	for i, id := range a.ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, id.String()...)
	}
	return string(append(b, '}')), nil
}
