package models

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
)

// Retries, delays and priorities. A pending task is claimable unless it is
// delayed: a submission with a run_at in the future (or a delay), and a
// failed attempt that its job retries after a backoff, store the task
// pending with delayed set and run_at its time on the database clock. The
// leader clears delayed once run_at has passed (PromoteDueTasks) and tells
// the job's workers; claims walk tasks_ready_idx, which holds only
// claimable pending tasks, in claim order (priority DESC, seq).

// MaxAttemptErrors bounds the errors a task keeps of its failed attempts.
const MaxAttemptErrors = 10

// TaskSched is when a submitted task may run and how it is ordered. The
// zero value is a task claimable at once with priority 0.
type TaskSched struct {
	Priority int
	// RunAt, when set, is the time it may run from; Delay, when set, is
	// that time as seconds from the database's now. At most one is set.
	RunAt *time.Time
	Delay *float64
}

// schedExprs are the run_at and delayed expressions of an insert, and
// their arguments (run_at's, then delayed's).
func (q *Q) schedExprs(s TaskSched) (runAt, delayed string, args []any) {
	switch {
	case s.RunAt != nil:
		runAt, args = "?", []any{Time{*s.RunAt}}
		if q.d == Postgres {
			runAt = "CAST(? AS timestamptz)"
		}
	case s.Delay != nil:
		runAt, args = q.plusFloatSeconds(q.now(), "?"), []any{*s.Delay}
	default:
		return "NULL", "false", nil
	}
	return runAt, "(" + runAt + " > " + q.now() + ")", append(args, args...)
}

// plusFloatSeconds is ts + secs seconds, secs a (fractional) number.
func (q *Q) plusFloatSeconds(ts, secs string) string {
	if q.d == Postgres {
		return "(" + ts + " + CAST(" + secs + " AS double precision) * interval '1 second')"
	}
	return "strftime('%Y-%m-%dT%H:%M:%fZ', " + ts + ", '+' || printf('%.6f', " + secs + ") || ' seconds')"
}

// sortClaimOrder sorts tasks as a claim takes them.
func sortClaimOrder(ts []Task) {
	slices.SortStableFunc(ts, func(a, b Task) int {
		if a.Priority != b.Priority {
			return b.Priority - a.Priority
		}
		return int(a.Seq - b.Seq)
	})
}

// AttemptError is one failed attempt's error, as Task.Errors keeps it.
type AttemptError struct {
	Attempt int       `json:"attempt"`
	Error   string    `json:"error"`
	At      time.Time `json:"at"`
}

// appendAttemptError adds one error to a task's JSON list, keeping the last
// MaxAttemptErrors.
func appendAttemptError(prev *string, e AttemptError) (string, error) {
	var list []AttemptError
	if prev != nil && *prev != "" {
		if err := json.Unmarshal([]byte(*prev), &list); err != nil {
			return "", fmt.Errorf("read task errors: %w", err)
		}
	}
	list = append(list, e)
	if len(list) > MaxAttemptErrors {
		list = list[len(list)-MaxAttemptErrors:]
	}
	b, err := json.Marshal(list)
	return string(b), err
}

// RecordAttemptError appends a failed attempt's error to the task's errors
// (the last MaxAttemptErrors), stamped with the database's clock.
func (q *Q) RecordAttemptError(t Task, msg string) error {
	now, err := q.DBNow()
	if err != nil {
		return err
	}
	list, err := appendAttemptError(t.Errors, AttemptError{Attempt: t.Attempt, Error: msg, At: now.UTC()})
	if err != nil {
		return err
	}
	if err := q.g.Exec("UPDATE tasks SET errors = ? WHERE id = ?", list, t.ID).Error; err != nil {
		return fmt.Errorf("record task error: %w", mapErr(err))
	}
	return nil
}

// RetryTaskLater puts a task that is in from (held by a worker, not past
// its deadline) back to pending, delayed until delay seconds from the
// database's now: its worker and the failed attempt's timestamps are
// cleared, its attempt count is kept, errMsg becomes its error. ok is false
// when the task was no longer in from, or is past its deadline.
func (q *Q) RetryTaskLater(id uuid.UUID, from string, errMsg *string, delay float64) (bool, error) {
	runAt := q.plusFloatSeconds(q.now(), "?")
	res := q.g.Exec("UPDATE tasks SET status = 'pending', delayed = true, run_at = "+runAt+", worker_id = NULL, claimed_at = NULL, started_at = NULL,"+
		" deadline_at = NULL, error = ?, updated_at = "+q.now()+", "+noProgress+
		" WHERE id = ? AND status = ? AND "+q.beforeDeadline(), delay, errMsg, id, from)
	if res.Error != nil {
		return false, fmt.Errorf("retry task later: %w", mapErr(res.Error))
	}
	return res.RowsAffected == 1, nil
}

// nextRunAtSQL is the leader's read of the next delayed task's time: the
// first entry of tasks_delayed_idx.
var nextRunAtSQL = map[Dialect]string{
	Postgres: "SELECT run_at, now() AS db_now FROM tasks WHERE status = 'pending' AND delayed ORDER BY run_at LIMIT 1",
	SQLite:   "SELECT run_at, " + sqliteNow + " AS db_now FROM tasks WHERE status = 'pending' AND delayed ORDER BY run_at LIMIT 1",
}

// NextRunAt returns when the earliest delayed task becomes due, and the
// database's now; ok is false when no task is delayed.
func (q *Q) NextRunAt() (at, now Time, ok bool, err error) {
	var rows []struct{ RunAt, DBNow Time }
	if err := q.g.Raw(nextRunAtSQL[q.d]).Scan(&rows).Error; err != nil {
		return Time{}, Time{}, false, fmt.Errorf("read next run_at: %w", mapErr(err))
	}
	if len(rows) == 0 {
		return Time{}, Time{}, false, nil
	}
	return rows[0].RunAt, rows[0].DBNow, true, nil
}

// PromoteDueTasks makes up to limit delayed tasks whose run_at has passed
// on the database's clock claimable, earliest first, and returns them as
// the API shows them (with their queue positions). The change carries the
// leader's fence. On PostgreSQL the rows are locked with SKIP LOCKED.
func (q *Q) PromoteDueTasks(limit int, fence LeaderFence) ([]Task, error) {
	lock := ""
	if q.d == Postgres {
		lock = " FOR UPDATE SKIP LOCKED"
	}
	where, args := q.andLeader("id IN (SELECT t.id FROM tasks t WHERE t.status = 'pending' AND t.delayed AND t.run_at <= "+q.now()+
		" ORDER BY t.run_at LIMIT ?"+lock+")", []any{limit}, fence)
	var ids []uuid.UUID
	err := q.g.Raw("UPDATE tasks SET delayed = false, updated_at = "+q.now()+" WHERE "+where+" RETURNING id", args...).Scan(&ids).Error
	if err != nil {
		return nil, fmt.Errorf("promote due tasks: %w", mapErr(err))
	}
	return q.GetTasks(ids)
}

// SetTaskRunAtAge moves a delayed task's run_at to age before the
// database's now, as if its time had come. Tests and benchmarks use it
// instead of waiting; the server never calls it.
func (q *Q) SetTaskRunAtAge(id uuid.UUID, age time.Duration) error {
	expr, arg := q.before(age)
	if err := q.g.Exec("UPDATE tasks SET run_at = "+expr+" WHERE id = ?", arg, id).Error; err != nil {
		return fmt.Errorf("set run_at: %w", mapErr(err))
	}
	return nil
}
