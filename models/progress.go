package models

import (
	"fmt"

	"github.com/google/uuid"
)

// Progress is what a worker reports of a task's advance; every field is
// optional.
type Progress struct {
	Current *float64
	Total   *float64
	Message *string
}

// ProgressRow is a task whose progress ReportProgress recorded.
type ProgressRow struct {
	ID         uuid.UUID
	RoomID     string
	JobName    string
	ProgressAt Time
}

// ReportProgress records the progress of a claimed or running task held by
// a worker of user's, that is not past its deadline and was not taken from
// a lost worker, and moves its deadline (heartbeat_timeout counts again from
// now), in one statement. ok is false when no such task exists (the caller
// finds out why).
func (q *Q) ReportProgress(id, userID uuid.UUID, p Progress) (ProgressRow, bool, error) {
	set := "progress_current = ?, progress_total = ?, progress_message = ?, progress_at = " + q.now() +
		", deadline_at = " + q.progressDeadline() + ", updated_at = " + q.now()
	owner := "SELECT 1 FROM workers w WHERE w.id = tasks.worker_id AND w.user_id = ?"
	if q.d == Postgres {
		owner += " OFFSET 0" // a per-row test, as in the hot report (see updateSQL)
	}
	where := " WHERE tasks.id = ? AND tasks.status IN ('claimed', 'running') AND " + q.beforeDeadline() +
		" AND (tasks.lost_worker_id IS NULL OR tasks.worker_id <> tasks.lost_worker_id)" +
		" AND EXISTS (" + owner + ")"
	var rows []ProgressRow
	var err error
	if q.d == Postgres {
		err = q.g.Raw("UPDATE tasks SET "+set+" FROM jobs j"+where+" AND j.id = tasks.job_id"+
			" RETURNING tasks.id, tasks.room_id, j.room_id || ':' || j.category || ':' || j.name AS job_name, tasks.progress_at",
			p.Current, p.Total, p.Message, id, userID).Scan(&rows).Error
	} else {
		err = q.g.Raw("UPDATE tasks SET "+set+where+
			" RETURNING id, room_id, (SELECT j.room_id || ':' || j.category || ':' || j.name FROM jobs j WHERE j.id = tasks.job_id) AS job_name, progress_at",
			p.Current, p.Total, p.Message, id, userID).Scan(&rows).Error
	}
	if err != nil {
		return ProgressRow{}, false, fmt.Errorf("record task progress: %w", mapErr(err))
	}
	if len(rows) == 0 {
		return ProgressRow{}, false, nil
	}
	return rows[0], true, nil
}
