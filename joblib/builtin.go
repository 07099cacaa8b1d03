package joblib

import (
	"context"
	"encoding/json"
	"time"

	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/models"
)

// RoomSummaryName is the built-in internal job @internal:analysis:RoomSummary.
const RoomSummaryName = "RoomSummary"

// RoomSummary is the result of the RoomSummary internal job: a snapshot of
// the coordinator's state as seen from the room the task was submitted to.
type RoomSummary struct {
	RoomID string `json:"room_id"`
	// Tasks counts the tasks submitted to the room by status, plus "total".
	// The summary's own task counts as running.
	Tasks map[string]int64 `json:"tasks"`
	// Jobs, Providers and Workers are what the room's listings show:
	// live jobs of the room, @global and @internal; providers of the room
	// and @global; workers serving those jobs.
	Jobs      int64       `json:"jobs"`
	Providers int64       `json:"providers"`
	Workers   int64       `json:"workers"`
	At        events.Time `json:"generated_at"`
}

// RoomSummaryJob is a built-in internal job: submit it to any room
// (POST /rooms/{room}/tasks/@internal:analysis:RoomSummary, payload {}) and
// the completed task's `result` is that room's RoomSummary, computed inside
// the server with a handful of count queries. It shows how an internal job
// is written: a schema, a handler honouring ctx, a JSON result.
func RoomSummaryJob(s *Service) InternalJob {
	return InternalJob{
		Category: "analysis",
		Name:     RoomSummaryName,
		Schema: json.RawMessage(`{"title":"RoomSummary","type":"object","properties":{},"additionalProperties":false,` +
			`"description":"Counts of the room's tasks by status and of the jobs, providers and workers visible from it."}`),
		Handler: func(ctx context.Context, t InternalTask) (json.RawMessage, error) {
			sum, err := s.roomSummary(ctx, t.RoomID)
			if err != nil {
				return nil, err
			}
			return json.Marshal(sum)
		},
	}
}

func (s *Service) roomSummary(ctx context.Context, room string) (RoomSummary, error) {
	q := s.db.Q(ctx)
	counts, err := q.RoomTaskCounts(room)
	if err != nil {
		return RoomSummary{}, err
	}
	tasks := map[string]int64{}
	var total int64
	for _, st := range []string{models.StatusPending, models.StatusClaimed, models.StatusRunning,
		models.StatusCompleted, models.StatusFailed, models.StatusCancelled} {
		tasks[st] = counts[st]
		total += counts[st]
	}
	tasks["total"] = total
	none := models.Page{Limit: 0}
	_, jobs, err := q.ListJobs(jobRoomsVisibleFrom(room), none)
	if err != nil {
		return RoomSummary{}, err
	}
	_, provs, err := q.ListProviders(providerRoomsVisibleFrom(room), none)
	if err != nil {
		return RoomSummary{}, err
	}
	_, workers, err := q.ListWorkersForJobRooms(jobRoomsVisibleFrom(room), none)
	if err != nil {
		return RoomSummary{}, err
	}
	return RoomSummary{RoomID: room, Tasks: tasks, Jobs: jobs, Providers: provs, Workers: workers,
		At: events.Time{Time: time.Now().UTC()}}, nil
}
