package models

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Task deadlines. A task's deadline_at is computed on the database clock by
// the statements that claim it and that record its progress:
//
//	claim:    now + min(task_timeout, heartbeat_timeout)
//	progress: min(claimed_at + task_timeout, now + heartbeat_timeout)
//
// (a missing limit drops out of the min; both missing: no deadline). A
// claimed or running task past its deadline is stuck: it takes no report
// but a cancellation, and the sweeper times it out (TimeOutTasks).

// Timeout limits, as TimedOutTask.Limit names them.
const (
	LimitTask      = "task_timeout"
	LimitHeartbeat = "heartbeat_timeout"
)

// plusSeconds is the timestamp expression ts + secs seconds (secs an
// integer expression; NULL gives NULL on both databases).
func (q *Q) plusSeconds(ts, secs string) string {
	if q.d == Postgres {
		return "(" + ts + " + " + secs + " * interval '1 second')"
	}
	return "strftime('%Y-%m-%dT%H:%M:%fZ', " + ts + ", '+' || " + secs + " || ' seconds')"
}

// least2 is the smaller of two nullable expressions, NULL only when both are.
func (q *Q) least2(a, b string) string {
	if q.d == Postgres {
		return "LEAST(" + a + ", " + b + ")"
	}
	return "min(COALESCE(" + a + ", " + b + "), COALESCE(" + b + ", " + a + "))"
}

// claimDeadline is the deadline_at a claim sets (columns of the claimed row).
func (q *Q) claimDeadline() string {
	now := "now()"
	if q.d != Postgres {
		now = "'now'"
	}
	return q.plusSeconds(now, q.least2("task_timeout", "heartbeat_timeout"))
}

// progressDeadline is the deadline_at a progress report sets (columns of
// tasks, qualified: the statement may join jobs, which has limits too).
func (q *Q) progressDeadline() string {
	now := "now()"
	if q.d != Postgres {
		now = "'now'"
	}
	return q.least2(q.plusSeconds("tasks.claimed_at", "tasks.task_timeout"), q.plusSeconds(now, "tasks.heartbeat_timeout"))
}

// beforeDeadline is the condition "the task is not past its deadline".
func (q *Q) beforeDeadline() string {
	return "(tasks.deadline_at IS NULL OR tasks.deadline_at > " + q.now() + ")"
}

// TaskOverdue reports whether a task is claimed or running past its
// deadline by the database's clock.
func (q *Q) TaskOverdue(id uuid.UUID) (bool, error) {
	var n int64
	err := q.g.Raw("SELECT count(*) FROM tasks WHERE id = ? AND status IN ('claimed', 'running') AND deadline_at <= "+q.now(), id).Scan(&n).Error
	if err != nil {
		return false, fmt.Errorf("read task deadline: %w", mapErr(err))
	}
	return n > 0, nil
}

// TimedOutTask is a task TimeOutTasks failed or requeued, with its evidence.
type TimedOutTask struct {
	Task
	// HeldBy is the worker that held it.
	HeldBy uuid.UUID
	// Limit is LimitTask or LimitHeartbeat, Seconds its value.
	Limit   string
	Seconds int
	// ClaimedAt, ProgressAt and DeadlineAt are as they were when it was
	// judged; DBNow is the database's clock then.
	ClaimedAt, ProgressAt, DeadlineAt, DBNow Time
}

// timeoutRequeue is true for a task whose job requeues timed-out tasks and
// that has attempts left.
const timeoutRequeue = "(j.on_timeout = 'requeue' AND tasks.attempt < j.max_attempts)"

// TimeOutTasks fails, or requeues per job policy (on_timeout), up to limit
// claimed or running tasks past their deadline by the database's clock,
// earliest deadline first, in a constant number of statements: one locks
// them (skipping rows another transaction holds), one changes them, one
// writes an audit_log row (action) per task with the evidence. A task that
// changed meanwhile is left alone, so each stuck task is timed out once.
// The change carries the leader's fence: a leader that stalled and woke
// after another node took over times nothing out.
func (q *Q) TimeOutTasks(limit int, action, actor string, sweepID *uuid.UUID, fence LeaderFence) ([]TimedOutTask, error) {
	lock := ""
	if q.d == Postgres {
		lock = " FOR UPDATE SKIP LOCKED"
	}
	var cands []struct {
		ID               uuid.UUID
		WorkerID         *uuid.UUID
		ClaimedAt        Time
		ProgressAt       Time
		DeadlineAt       Time
		TaskTimeout      *int
		HeartbeatTimeout *int
		DBNow            Time
	}
	err := q.g.Raw("SELECT t.id, t.worker_id, t.claimed_at, t.progress_at, t.deadline_at, t.task_timeout, t.heartbeat_timeout, "+q.now()+" AS db_now"+
		" FROM tasks t WHERE t.status IN ('claimed', 'running') AND t.deadline_at < "+q.now()+
		" ORDER BY t.deadline_at LIMIT ?"+lock, limit).Scan(&cands).Error
	if err != nil {
		return nil, fmt.Errorf("lock stuck tasks: %w", mapErr(err))
	}
	if len(cands) == 0 {
		return nil, nil
	}
	ids := make([]uuid.UUID, len(cands))
	for i, c := range cands {
		ids[i] = c.ID
	}
	now := q.now()
	byTask := q.plusSeconds("tasks.claimed_at", "tasks.task_timeout") + " <= tasks.deadline_at"
	msg := "'Task timed out: ' || CASE WHEN " + byTask + " THEN 'task_timeout of ' || tasks.task_timeout || 's passed since the claim'" +
		" ELSE 'heartbeat_timeout of ' || tasks.heartbeat_timeout || 's passed without progress' END"
	set := "status = CASE WHEN " + timeoutRequeue + " THEN 'pending' ELSE 'failed' END" +
		", worker_id = CASE WHEN " + timeoutRequeue + " THEN NULL ELSE tasks.worker_id END" +
		", claimed_at = CASE WHEN " + timeoutRequeue + " THEN NULL ELSE tasks.claimed_at END" +
		", started_at = CASE WHEN " + timeoutRequeue + " THEN NULL ELSE tasks.started_at END" +
		", completed_at = CASE WHEN " + timeoutRequeue + " THEN tasks.completed_at ELSE " + now + " END" +
		", error = CASE WHEN " + timeoutRequeue + " THEN tasks.error ELSE " + msg + " END" +
		", deadline_at = NULL, updated_at = " + now
	ret := "tasks.id, tasks.seq, tasks.job_id, tasks.worker_id, tasks.lost_worker_id, tasks.room_id, tasks.created_by_id, tasks.payload, tasks.status, tasks.attempt," +
		" tasks.created_at, tasks.claimed_at, tasks.started_at, tasks.completed_at, tasks.error, tasks.result," +
		" tasks.task_timeout, tasks.heartbeat_timeout, tasks.progress_current, tasks.progress_total, tasks.progress_message, tasks.progress_at"
	if q.d == Postgres {
		ret += ", j.room_id AS job_room, j.category AS job_category, j.name AS job_name, j.on_worker_loss, j.max_attempts, j.on_timeout"
	} else {
		ret = strings.ReplaceAll(ret, "tasks.", "")
	}
	// The rows are locked (PostgreSQL; SQLite's one writer holds the
	// database): no report or cleanup changed them since they were read.
	in, arg := q.inIDs("tasks.id", ids)
	where, args := q.andLeader("j.id = tasks.job_id AND "+in, []any{arg}, fence)
	rows, err := q.g.Raw("UPDATE tasks SET "+set+" FROM jobs j WHERE "+where+" RETURNING "+ret, args...).Rows()
	if err != nil {
		return nil, fmt.Errorf("time out stuck tasks: %w", mapErr(err))
	}
	var ts []Task
	for rows.Next() {
		var t Task
		dest := []any{&t.ID, &t.Seq, &t.JobID, &t.WorkerID, &t.LostWorkerID, &t.RoomID, &t.CreatedByID, &t.Payload, &t.Status, &t.Attempt,
			&t.CreatedAt, &t.ClaimedAt, &t.StartedAt, &t.CompletedAt, &t.Error, &t.Result,
			&t.TaskTimeout, &t.HeartbeatTimeout, &t.ProgressCurrent, &t.ProgressTotal, &t.ProgressMessage, &t.ProgressAt}
		if q.d == Postgres {
			dest = append(dest, &t.JobRoom, &t.JobCategory, &t.JobName, &t.OnWorkerLoss, &t.MaxAttempts, &t.OnTimeout)
		}
		if err := rows.Scan(dest...); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read timed-out tasks: %w", mapErr(err))
		}
		ts = append(ts, t)
	}
	if err := rows.Close(); err != nil {
		return nil, fmt.Errorf("time out stuck tasks: %w", mapErr(err))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("time out stuck tasks: %w", mapErr(err))
	}
	if len(ts) == 0 {
		return nil, nil
	}
	if q.d != Postgres {
		if err := q.fillTaskJobs(ts); err != nil {
			return nil, err
		}
	}
	byID := make(map[uuid.UUID]int, len(cands))
	for i, c := range cands {
		byID[c.ID] = i
	}
	out := make([]TimedOutTask, 0, len(ts))
	for _, t := range ts {
		c := cands[byID[t.ID]]
		o := TimedOutTask{Task: t, ClaimedAt: c.ClaimedAt, ProgressAt: c.ProgressAt, DeadlineAt: c.DeadlineAt, DBNow: c.DBNow}
		if c.WorkerID != nil {
			o.HeldBy = *c.WorkerID
		}
		if c.TaskTimeout != nil && !c.ClaimedAt.Add(time.Duration(*c.TaskTimeout)*time.Second).After(c.DeadlineAt.Time) {
			o.Limit, o.Seconds = LimitTask, *c.TaskTimeout
		} else if c.HeartbeatTimeout != nil {
			o.Limit, o.Seconds = LimitHeartbeat, *c.HeartbeatTimeout
		}
		out = append(out, o)
	}
	if err := q.insertTimeoutAudit(out, action, actor, sweepID); err != nil {
		return nil, err
	}
	return out, nil
}

// insertTimeoutAudit writes one audit_log row per timed-out task, in one
// statement whatever their number.
func (q *Q) insertTimeoutAudit(ts []TimedOutTask, action, actor string, sweepID *uuid.UUID) error {
	type row struct {
		ID      uuid.UUID `json:"id"`
		Subject uuid.UUID `json:"subject_id"`
		Detail  string    `json:"detail"`
	}
	rows := make([]row, len(ts))
	for i, t := range ts {
		outcome := "failed"
		if t.Status == StatusPending {
			outcome = "requeued"
		}
		d, err := json.Marshal(map[string]any{
			"limit": t.Limit, "seconds": t.Seconds, "worker_id": t.HeldBy, "job": t.JobFullName(), "room_id": t.RoomID,
			"outcome": outcome, "attempt": t.Attempt, "claimed_at": t.ClaimedAt.Ptr(), "progress_at": t.ProgressAt.Ptr(),
			"deadline_at": t.DeadlineAt.Ptr(), "db_now": t.DBNow.Ptr(), "sweep_id": sweepID,
		})
		if err != nil {
			return fmt.Errorf("encode timeout audit: %w", err)
		}
		rows[i] = row{ID: uuid.New(), Subject: t.ID, Detail: string(d)}
	}
	payload, err := json.Marshal(rows)
	if err != nil {
		return fmt.Errorf("encode timeout audit: %w", err)
	}
	cols := "INSERT INTO audit_log (id, action, subject_id, actor, detail, created_at) "
	var stmt string
	if q.d == Postgres {
		stmt = cols + "SELECT r.id, ?, r.subject_id, ?, r.detail, now() FROM json_to_recordset(?::json) AS r(id uuid, subject_id uuid, detail text)"
	} else {
		stmt = cols + "SELECT value->>'id', ?, value->>'subject_id', ?, value->>'detail', " + q.now() + " FROM json_each(?)"
	}
	if err := q.g.Exec(stmt, action, actor, string(payload)).Error; err != nil {
		return fmt.Errorf("write timeout audit: %w", mapErr(err))
	}
	return nil
}

// SetTaskClaimAge moves the claim (and the last progress, when there is
// one) of held tasks age into the past on the database clock and
// recomputes their deadlines, as if they had been claimed age ago. Tests
// and benchmarks use it instead of waiting; the server never calls it.
func (q *Q) SetTaskClaimAge(ids []uuid.UUID, age time.Duration) error {
	expr, arg := q.before(age)
	for start := 0; start < len(ids); start += MaxCleanupBatch {
		part := ids[start:min(start+MaxCleanupBatch, len(ids))]
		err := q.g.Exec("UPDATE tasks SET claimed_at = "+expr+", progress_at = CASE WHEN progress_at IS NULL THEN NULL ELSE "+expr+" END WHERE id IN ?", arg, arg, part).Error
		if err != nil {
			return fmt.Errorf("set claim age: %w", mapErr(err))
		}
		hb := q.least2(q.plusSeconds("claimed_at", "task_timeout"), q.plusSeconds("COALESCE(progress_at, claimed_at)", "heartbeat_timeout"))
		if err := q.g.Exec("UPDATE tasks SET deadline_at = "+hb+" WHERE id IN ?", part).Error; err != nil {
			return fmt.Errorf("set claim age: %w", mapErr(err))
		}
	}
	return nil
}
