package models

import (
	"fmt"

	"github.com/google/uuid"
)

// CompleteTaskWithResult moves a task from `from` to completed and stores
// its result (a JSON document; internal jobs produce one). ok is false if the
// task was no longer in from.
func (q *Q) CompleteTaskWithResult(id uuid.UUID, from, result string) (bool, error) {
	res := q.g.Exec("UPDATE tasks SET status = 'completed', completed_at = "+q.now()+", updated_at = "+q.now()+", result = ? WHERE id = ? AND status = ?",
		result, id, from)
	if res.Error != nil {
		return false, fmt.Errorf("complete task: %w", mapErr(res.Error))
	}
	return res.RowsAffected == 1, nil
}

// RoomTaskCounts counts the tasks submitted to a room by status.
func (q *Q) RoomTaskCounts(room string) (map[string]int64, error) {
	var rows []struct {
		Status string
		N      int64
	}
	if err := q.g.Raw("SELECT status, count(*) AS n FROM tasks WHERE room_id = ? GROUP BY status", room).Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("count room tasks: %w", mapErr(err))
	}
	out := make(map[string]int64, len(rows))
	for _, r := range rows {
		out[r.Status] = r.N
	}
	return out, nil
}
