package models

import (
	"fmt"
	"strings"

	"github.com/google/uuid"
)

// Progress is what a worker reports of a task's advance; every field is
// optional.
type Progress struct {
	Current *float64
	Total   *float64
	Message *string
}

// ReportProgress records the progress of a claimed or running task held by
// a worker of user's, that is not past its deadline and was not taken from
// a lost worker, and moves its deadline (heartbeat_timeout counts again from
// now), and returns the task as the API shows it: one statement on
// PostgreSQL. ok is false when no such task exists (the caller finds out
// why).
func (q *Q) ReportProgress(id, userID uuid.UUID, p Progress) (Task, bool, error) {
	set := "progress_current = ?, progress_total = ?, progress_message = ?, progress_at = " + q.now() +
		", deadline_at = " + q.progressDeadline() + ", updated_at = " + q.now()
	owner := "SELECT 1 FROM workers w WHERE w.id = tasks.worker_id AND w.user_id = ?"
	if q.d == Postgres {
		owner += " OFFSET 0" // a per-row test, as in the hot report (see updateSQL)
	}
	where := " WHERE tasks.id = ? AND tasks.status IN ('claimed', 'running') AND " + q.beforeDeadline() +
		" AND (tasks.lost_worker_id IS NULL OR tasks.worker_id <> tasks.lost_worker_id)" +
		" AND EXISTS (" + owner + ")"
	var ts []Task
	if q.d == Postgres {
		// The changed row with its job's columns, as taskSelect reads it
		// (a held task has no queue position).
		ret := strings.ReplaceAll(taskCols, "t.", "tasks.")
		err := q.g.Raw("UPDATE tasks SET "+set+" FROM jobs j"+where+" AND j.id = tasks.job_id RETURNING "+ret+", NULL::bigint AS queue_position",
			p.Current, p.Total, p.Message, id, userID).Scan(&ts).Error
		if err != nil {
			return Task{}, false, fmt.Errorf("record task progress: %w", mapErr(err))
		}
		if len(ts) == 0 {
			return Task{}, false, nil
		}
		return ts[0], true, nil
	}
	res := q.g.Exec("UPDATE tasks SET "+set+where, p.Current, p.Total, p.Message, id, userID)
	if res.Error != nil {
		return Task{}, false, fmt.Errorf("record task progress: %w", mapErr(res.Error))
	}
	if res.RowsAffected == 0 {
		return Task{}, false, nil
	}
	t, err := q.GetTask(id)
	return t, err == nil, err
}
