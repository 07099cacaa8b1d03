package models

import (
	"fmt"
	"time"

	"github.com/google/uuid"
)

// MaxPruneBatch is the largest number of tasks one PruneTasks call deletes.
const MaxPruneBatch = 10000

// finishedStatus maps a terminal status to its SQL literal. The literal is
// written into the statement (never bound) so that PostgreSQL plans every
// batch on the (status, completed_at) index, custom or generic plan alike.
func finishedStatus(status string) (string, error) {
	switch status {
	case StatusCompleted, StatusFailed, StatusCancelled:
		return "'" + status + "'", nil
	}
	return "", fmt.Errorf("prune tasks: status %q is not terminal", status)
}

// PruneTasks deletes up to limit tasks in the terminal status whose
// completed_at is older than age by the database's clock, oldest first, and
// returns how many it deleted. Tasks in any other status are never touched,
// whatever their timestamps. On PostgreSQL the batch skips rows another
// transaction holds and locks the ones it deletes, so a task retried (back
// to pending) at the same moment is kept.
func (q *Q) PruneTasks(status string, age time.Duration, limit int, lead LeaderFence) (int64, error) {
	lit, err := finishedStatus(status)
	if err != nil {
		return 0, err
	}
	if age <= 0 {
		return 0, fmt.Errorf("prune tasks: age must be positive, got %s", age)
	}
	limit = max(1, min(limit, MaxPruneBatch))
	cutoff, arg := q.before(age) // the database's clock, never the process's
	cond := "status = " + lit + " AND completed_at < " + cutoff
	cond, cargs := q.andLeader(cond, []any{arg}, lead)
	var sql string
	var args []any
	if q.d == Postgres {
		// The batch is a materialized CTE: as a plain IN (subquery) the
		// planner may rescan the LIMITed subquery per row and delete far
		// more than the batch. FOR UPDATE re-checks status and age on the
		// newest row version, so a task retried meanwhile is not chosen.
		sql, args = "WITH batch AS MATERIALIZED (SELECT id FROM tasks WHERE "+cond+" ORDER BY completed_at LIMIT ? FOR UPDATE SKIP LOCKED) DELETE FROM tasks t USING batch b WHERE t.id = b.id", append(cargs, limit)
	} else {
		sql, args = "DELETE FROM tasks WHERE seq IN (SELECT seq FROM tasks WHERE "+cond+" ORDER BY completed_at LIMIT ?)", append(cargs, limit)
	}
	r := q.g.Exec(sql, args...)
	if r.Error != nil {
		return 0, fmt.Errorf("prune %s tasks: %w", status, mapErr(r.Error))
	}
	return r.RowsAffected, nil
}

// CountPrunableTasks counts the tasks PruneTasks would delete in status with
// age, without a limit (operator dry run).
func (q *Q) CountPrunableTasks(status string, age time.Duration) (int64, error) {
	lit, err := finishedStatus(status)
	if err != nil {
		return 0, err
	}
	if age <= 0 {
		return 0, fmt.Errorf("count prunable tasks: age must be positive, got %s", age)
	}
	expr, arg := q.before(age)
	var n int64
	if err := q.g.Raw("SELECT count(*) FROM tasks WHERE status = "+lit+" AND completed_at < "+expr, arg).Scan(&n).Error; err != nil {
		return 0, fmt.Errorf("count prunable %s tasks: %w", status, mapErr(err))
	}
	return n, nil
}

// SetTaskCompletedAge moves the tasks' completed_at to the database's now
// minus age, whatever their status. Tests and benchmarks use it to age tasks
// without touching any clock; the server never calls it.
func (q *Q) SetTaskCompletedAge(ids []uuid.UUID, age time.Duration) error {
	expr, arg := q.before(age)
	for start := 0; start < len(ids); start += MaxCleanupBatch {
		part := ids[start:min(start+MaxCleanupBatch, len(ids))]
		if err := q.g.Exec("UPDATE tasks SET completed_at = "+expr+" WHERE id IN ?", arg, part).Error; err != nil {
			return fmt.Errorf("set task age: %w", mapErr(err))
		}
	}
	return nil
}
