package models

import (
	"fmt"
	"strings"

	"github.com/google/uuid"
)

// taskCols are a task's columns and what the API shows of its job.
const taskCols = `t.id, t.seq, t.job_id, t.worker_id, t.lost_worker_id, t.room_id, t.created_by_id, t.payload, t.status, t.attempt,
 t.created_at, t.claimed_at, t.started_at, t.completed_at, t.error, t.result,
 j.room_id AS job_room, j.category AS job_category, j.name AS job_name, j.on_worker_loss, j.max_attempts,
 t.task_timeout, t.heartbeat_timeout, t.deadline_at, t.progress_current, t.progress_total, t.progress_message, t.progress_at, j.on_timeout,
 t.priority, t.run_at, t.delayed, t.errors, j.retry_backoff, j.retry_max_backoff`

// taskSelect reads single tasks: a claimable pending task's queue position
// is the number of claimable tasks of its job a claim takes before it or it
// (higher priority, or the same and an earlier seq): two counts over
// tasks_ready_idx up to it, linear in the position. A delayed task has
// none until it is due.
const taskSelect = `SELECT ` + taskCols + `,
 CASE WHEN t.status = 'pending' AND NOT t.delayed THEN
  (SELECT count(*) FROM tasks p WHERE p.job_id = t.job_id AND p.status = 'pending' AND NOT p.delayed AND p.priority > t.priority) +
  (SELECT count(*) FROM tasks p WHERE p.job_id = t.job_id AND p.status = 'pending' AND NOT p.delayed AND p.priority = t.priority AND p.seq <= t.seq) END AS queue_position
 FROM tasks t LEFT JOIN jobs j ON j.id = t.job_id `

// tasksSelect reads many tasks (cond over t and j; tail orders and pages
// them) and ranks, in one pass, the claimable pending tasks of the jobs
// involved in claim order (priority, then seq), over those that may be
// ahead of a task read (at least the lowest priority read, and either a
// higher one or a seq up to the newest read: a range of tasks_ready_idx): the queue positions of a page cost one scan of those
// pending tasks, never a count per row. The caller appends the final ORDER
// BY over the columns of page.
func tasksSelect(cond, tail string) string {
	return `WITH page AS MATERIALIZED (SELECT ` + taskCols + ` FROM tasks t LEFT JOIN jobs j ON j.id = t.job_id ` + cond + ` ` + tail + `),
 ranks AS MATERIALIZED (SELECT r.id, r.queue_position FROM (
  SELECT p.id, row_number() OVER (PARTITION BY p.job_id ORDER BY p.priority DESC, p.seq) AS queue_position FROM tasks p
  WHERE p.status = 'pending' AND NOT p.delayed AND p.job_id IN (SELECT job_id FROM page WHERE status = 'pending' AND NOT delayed)
  AND p.priority >= (SELECT min(priority) FROM page WHERE status = 'pending' AND NOT delayed)
  AND (p.seq <= (SELECT max(seq) FROM page WHERE status = 'pending' AND NOT delayed)
   OR p.priority > (SELECT min(priority) FROM page WHERE status = 'pending' AND NOT delayed))) r
  WHERE r.id IN (SELECT id FROM page WHERE status = 'pending' AND NOT delayed))
 SELECT page.*, ranks.queue_position FROM page LEFT JOIN ranks ON ranks.id = page.id `
}

// InsertTask creates a task with the given status and returns it as the API shows it.
func (q *Q) InsertTask(id, jobID uuid.UUID, roomID string, createdBy *uuid.UUID, payload, status string) (Task, error) {
	return q.InsertTaskTimeout(id, jobID, roomID, createdBy, payload, status, nil)
}

// InsertTaskTimeout is InsertTask with the task's own task_timeout in
// seconds (nil: the job's). The task takes its job's limits.
func (q *Q) InsertTaskTimeout(id, jobID uuid.UUID, roomID string, createdBy *uuid.UUID, payload, status string, timeout *int) (Task, error) {
	return q.InsertTaskSched(id, jobID, roomID, createdBy, payload, status, timeout, TaskSched{})
}

// InsertTaskSched is InsertTaskTimeout with the task's priority and the
// time it may run from.
func (q *Q) InsertTaskSched(id, jobID uuid.UUID, roomID string, createdBy *uuid.UUID, payload, status string, timeout *int, s TaskSched) (Task, error) {
	runAt, delayed, sargs := q.schedExprs(s)
	args := append([]any{id, roomID, createdBy, payload, status, timeout, s.Priority}, sargs...)
	err := q.g.Exec("INSERT INTO tasks (id, job_id, room_id, created_by_id, payload, status, created_at, updated_at, task_timeout, heartbeat_timeout, priority, run_at, delayed)"+
		" SELECT ?, j.id, ?, ?, ?, ?, "+q.now()+", "+q.now()+", COALESCE(?, j.task_timeout), j.heartbeat_timeout, ?, "+runAt+", "+delayed+" FROM jobs j WHERE j.id = ?",
		append(args, jobID)...).Error
	if err != nil {
		return Task{}, fmt.Errorf("insert task: %w", mapErr(err))
	}
	return q.GetTask(id)
}

// GetTask reads one task with its job's name and its queue position.
func (q *Q) GetTask(id uuid.UUID) (Task, error) {
	var ts []Task
	if err := q.g.Raw(taskSelect+"WHERE t.id = ?", id).Scan(&ts).Error; err != nil {
		return Task{}, fmt.Errorf("read task: %w", mapErr(err))
	}
	if len(ts) == 0 {
		return Task{}, ErrNotFound
	}
	return ts[0], nil
}

// GetTasks reads several tasks, in seq order.
func (q *Q) GetTasks(ids []uuid.UUID) ([]Task, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	// Chunked: a cleanup can return more tasks than one statement may bind.
	const chunk = 5000
	var ts []Task
	for start := 0; start < len(ids); start += chunk {
		var part []Task
		if err := q.g.Raw(tasksSelect("WHERE t.id IN ?", "")+"ORDER BY page.seq", ids[start:min(start+chunk, len(ids))]).Scan(&part).Error; err != nil {
			return nil, fmt.Errorf("read tasks: %w", mapErr(err))
		}
		ts = append(ts, part...)
	}
	return ts, nil
}

// TaskFilter selects tasks for a listing.
type TaskFilter struct {
	RoomID string     // the room the tasks were submitted to; empty: every room (operators)
	JobID  *uuid.UUID // optional
	Status string     // optional
}

// ListTasks pages through tasks, newest first.
func (q *Q) ListTasks(f TaskFilter, p Page) ([]Task, int64, error) {
	where := []string{"1 = 1"}
	var args []any
	if f.RoomID != "" {
		where = append(where, "t.room_id = ?")
		args = append(args, f.RoomID)
	}
	if f.JobID != nil {
		where = append(where, "t.job_id = ?")
		args = append(args, *f.JobID)
	}
	if f.Status != "" {
		where = append(where, "t.status = ?")
		args = append(args, f.Status)
	}
	cond := "WHERE " + strings.Join(where, " AND ")
	var total int64
	if err := q.g.Raw("SELECT count(*) FROM tasks t "+cond, args...).Scan(&total).Error; err != nil {
		return nil, 0, fmt.Errorf("count tasks: %w", mapErr(err))
	}
	ts := []Task{}
	if p.Limit > 0 {
		err := q.g.Raw(tasksSelect(cond, "ORDER BY t.created_at DESC, t.seq DESC LIMIT ? OFFSET ?")+"ORDER BY page.created_at DESC, page.seq DESC",
			append(args, p.Limit, p.Offset)...).Scan(&ts).Error
		if err != nil {
			return nil, 0, fmt.Errorf("list tasks: %w", mapErr(err))
		}
	}
	return ts, total, nil
}

// noProgress clears a task's progress: a claim starts a new attempt.
const noProgress = "progress_current = NULL, progress_total = NULL, progress_message = NULL, progress_at = NULL"

// ClaimTask is ClaimTasks for one task; ok is false when nothing is claimable.
func (q *Q) ClaimTask(workerID uuid.UUID) (Task, bool, error) {
	ts, err := q.ClaimTasks(workerID, 1, false)
	if err != nil || len(ts) == 0 {
		return Task{}, false, err
	}
	return ts[0], true, nil
}

// claimPick is the query of the tasks ClaimTasks claims for the worker, up
// to limit, and its arguments.
//
// On SQLite it takes the first limit entries of tasks_ready_idx of each of
// the worker's jobs, then the first limit of those in claim order. With
// PostgreSQL's form, one pick over all the jobs' pending tasks, SQLite read
// every pending task of the jobs and sorted them: 13 ms per claim at 20,000
// pending (TestSQLiteClaimReadsTheHeadsOfItsJobs). On PostgreSQL that form
// is locked with SKIP LOCKED (the request path claims with
// DB.ClaimTasksHot, which walks tasks_ready_idx whatever the statistics
// say).
func claimPick(d Dialect, workerID uuid.UUID, limit int) (string, []any) {
	if d == SQLite {
		return "SELECT t.id FROM worker_job_links l JOIN jobs j ON j.id = l.job_id AND j.room_id <> '@internal'" +
			" JOIN tasks t ON t.id IN (SELECT p.id FROM tasks p WHERE p.job_id = l.job_id AND p.status = 'pending' AND NOT p.delayed" +
			" ORDER BY p.priority DESC, p.seq LIMIT ?) WHERE l.worker_id = ? ORDER BY t.priority DESC, t.seq LIMIT ?", []any{limit, workerID, limit}
	}
	return "SELECT t.id FROM tasks t WHERE t.status = 'pending' AND NOT t.delayed AND t.job_id IN" +
		" (SELECT l.job_id FROM worker_job_links l JOIN jobs j ON j.id = l.job_id WHERE l.worker_id = ? AND j.room_id <> '@internal')" +
		" ORDER BY t.priority DESC, t.seq LIMIT ?", []any{workerID, limit}
}

// ClaimTasks atomically moves up to limit of the first claimable pending
// tasks (highest priority, then oldest; never a delayed one) of the worker's
// linked (non-internal) jobs to claimed for that worker, and returns them in
// that order (none when nothing is claimable); with start they go to
// running at once (claimed and started in one step). On PostgreSQL
// concurrent claimers skip each other's locked rows, so every task goes to
// exactly one claimer; on SQLite the single connection serialises claimers.
// (The PostgreSQL request path uses DB.ClaimTasksHot.)
func (q *Q) ClaimTasks(workerID uuid.UUID, limit int, start bool) ([]Task, error) {
	lock := ""
	if q.d == Postgres {
		lock = " FOR UPDATE SKIP LOCKED"
	}
	to := "status = 'claimed'"
	if start {
		to = "status = 'running', started_at = " + q.now()
	}
	pick, args := claimPick(q.d, workerID, limit)
	var ids []uuid.UUID
	err := q.g.Raw("UPDATE tasks SET "+to+", worker_id = ?, attempt = attempt + 1, claimed_at = "+q.now()+", updated_at = "+q.now()+", deadline_at = "+q.claimDeadline()+", "+noProgress+
		" WHERE id IN ("+pick+lock+") RETURNING id", append([]any{workerID}, args...)...).Scan(&ids).Error
	if err != nil {
		return nil, fmt.Errorf("claim task: %w", mapErr(err))
	}
	ts, err := q.GetTasks(ids)
	sortClaimOrder(ts)
	return ts, err
}

// TransitionTask moves a task from one status to another if it is still in
// from; it sets started_at on running and completed_at (and errMsg, when not
// empty) on terminal statuses. ok is false if the task was no longer in from,
// or (for any change but a cancellation) is past its deadline.
func (q *Q) TransitionTask(id uuid.UUID, from, to string, workerID *uuid.UUID, errMsg *string) (bool, error) {
	set := []string{"status = ?", "updated_at = " + q.now()}
	args := []any{to}
	switch to {
	case StatusRunning:
		set = append(set, "started_at = "+q.now())
	case StatusClaimed:
		set = append(set, "claimed_at = "+q.now(), "attempt = attempt + 1")
		if workerID != nil {
			set = append(set, "worker_id = ?")
			args = append(args, *workerID)
		}
	case StatusCompleted, StatusFailed, StatusCancelled:
		set = append(set, "completed_at = "+q.now())
		if errMsg != nil && *errMsg != "" {
			set = append(set, "error = ?")
			args = append(args, *errMsg)
		}
	}
	args = append(args, id, from)
	fence := ""
	if to != StatusCancelled {
		fence = " AND " + q.beforeDeadline()
	}
	res := q.g.Exec("UPDATE tasks SET "+strings.Join(set, ", ")+" WHERE id = ? AND status = ?"+fence, args...)
	if res.Error != nil {
		return false, fmt.Errorf("update task status: %w", mapErr(res.Error))
	}
	return res.RowsAffected == 1, nil
}

// SetTaskResult stores the result a worker reported with the task's
// completion (compact JSON).
func (q *Q) SetTaskResult(id uuid.UUID, result string) error {
	if err := q.g.Exec("UPDATE tasks SET result = ? WHERE id = ?", result, id).Error; err != nil {
		return fmt.Errorf("store task result: %w", mapErr(err))
	}
	return nil
}

// RetryTask puts a failed task back to pending (operator retry): its worker,
// timestamps of the failed attempt and error are cleared, its attempt count
// is kept. ok is false when the task is not failed (any more).
func (q *Q) RetryTask(id uuid.UUID) (bool, error) {
	res := q.g.Exec("UPDATE tasks SET status = 'pending', worker_id = NULL, claimed_at = NULL, started_at = NULL, completed_at = NULL, error = NULL, updated_at = "+q.now()+
		" WHERE id = ? AND status = 'failed'", id)
	if res.Error != nil {
		return false, fmt.Errorf("retry task: %w", mapErr(res.Error))
	}
	return res.RowsAffected == 1, nil
}

// CountTasksByStatus reads the number of tasks per status from the counts
// triggers keep (task_counts): its cost does not grow with the tasks table.
// On PostgreSQL it first folds the pending deltas into the counts (one
// statement; its cost is the number of status changes since the last read).
func (q *Q) CountTasksByStatus() (map[string]int64, error) {
	if q.d == Postgres {
		err := q.g.Exec(`WITH moved AS (DELETE FROM task_count_deltas RETURNING status, d),
	sums AS (SELECT status, sum(d) AS d FROM moved GROUP BY status)
INSERT INTO task_counts AS c (status, n) SELECT status, d FROM sums
ON CONFLICT (status) DO UPDATE SET n = c.n + excluded.n`).Error
		if err != nil {
			return nil, fmt.Errorf("fold task count deltas: %w", mapErr(err))
		}
	}
	var rows []struct {
		Status string
		N      int64
	}
	if err := q.g.Raw("SELECT status, n FROM task_counts").Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("count tasks by status: %w", mapErr(err))
	}
	out := make(map[string]int64, len(rows))
	for _, r := range rows {
		out[r.Status] = r.N
	}
	return out, nil
}

// InsertAudit appends an operator action to the audit log.
func (q *Q) InsertAudit(action string, subject *uuid.UUID, actor, detail string) error {
	if detail == "" {
		detail = "{}"
	}
	err := q.g.Exec("INSERT INTO audit_log (id, action, subject_id, actor, detail, created_at) VALUES (?, ?, ?, ?, ?, "+q.now()+")",
		uuid.New(), action, subject, actor, detail).Error
	if err != nil {
		return fmt.Errorf("write audit log: %w", mapErr(err))
	}
	return nil
}

// AuditEntry is one operator action.
type AuditEntry struct {
	ID        uuid.UUID
	Action    string
	SubjectID *uuid.UUID
	Actor     string
	Detail    string
	CreatedAt Time
}

// ListAudit returns the audit log entries about a subject, oldest first.
func (q *Q) ListAudit(subject uuid.UUID) ([]AuditEntry, error) {
	var es []AuditEntry
	err := q.g.Raw("SELECT id, action, subject_id, actor, detail, created_at FROM audit_log WHERE subject_id = ? ORDER BY seq", subject).Scan(&es).Error
	if err != nil {
		return nil, fmt.Errorf("read audit log: %w", mapErr(err))
	}
	return es, nil
}

// ListAuditLog returns up to limit audit log entries, newest first,
// optionally only those of one action.
func (q *Q) ListAuditLog(action string, limit int) ([]AuditEntry, error) {
	where, args := "", []any{}
	if action != "" {
		where, args = " WHERE action = ?", append(args, action)
	}
	var es []AuditEntry
	err := q.g.Raw("SELECT id, action, subject_id, actor, detail, created_at FROM audit_log"+where+" ORDER BY seq DESC LIMIT ?", append(args, limit)...).Scan(&es).Error
	if err != nil {
		return nil, fmt.Errorf("read audit log: %w", mapErr(err))
	}
	return es, nil
}
