package joblib

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
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

// BuiltinJobNames are the full names of the internal jobs joblib ships.
// They are off by default (JOBLIB_BUILTIN_JOBS): a room lists exactly the
// jobs its clients registered, as with the Python server.
var BuiltinJobNames = []string{RoomInternal + ":analysis:" + RoomSummaryName}

// builtinKeys are BuiltinJobNames as (category, name) in @internal.
var builtinKeys = [][2]string{{"analysis", RoomSummaryName}}

// RetireBuiltinJobs soft-deletes the job rows of built-in internal jobs
// that this process does not run, left by an earlier run that enabled them,
// so that rooms stop listing them. A row a superuser registered through
// REST (it has worker links) is left alone.
func (s *Service) RetireBuiltinJobs(ctx context.Context) error {
	return s.db.Tx(ctx, func(q *models.Q) error {
		for _, k := range builtinKeys {
			full := RoomInternal + ":" + k[0] + ":" + k[1]
			if _, ok := s.internalJob(full); ok {
				continue
			}
			j, err := q.JobByKey(RoomInternal, k[0], k[1])
			if errors.Is(err, models.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			if j.Deleted {
				continue
			}
			links, err := q.JobWorkerIDs([]uuid.UUID{j.ID})
			if err != nil {
				return err
			}
			if len(links[j.ID]) > 0 {
				continue
			}
			if err := q.SetJobDeleted(j.ID, true); err != nil {
				return fmt.Errorf("retire built-in job %s: %w", full, err)
			}
		}
		return nil
	})
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
