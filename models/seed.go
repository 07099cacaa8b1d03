package models

import (
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
)

// SeedWorkers bulk-inserts n workers of userID, each linked to jobID and
// holding tasksEach tasks of that job (alternately claimed and running),
// with last heartbeats age ago by the database's clock. Benchmarks and
// tests use it to build large fleets in a few statements; the server never
// calls it.
func (q *Q) SeedWorkers(userID, jobID uuid.UUID, n, tasksEach int, age time.Duration) ([]uuid.UUID, error) {
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = uuid.New()
	}
	hb, hbArg := q.before(age)
	const rows = 1000
	for start := 0; start < n; start += rows {
		part := ids[start:min(start+rows, n)]
		var sb strings.Builder
		args := make([]any, 0, 3*len(part))
		sb.WriteString("INSERT INTO workers (id, user_id, last_heartbeat, created_at) VALUES ")
		for i, id := range part {
			if i > 0 {
				sb.WriteString(", ")
			}
			sb.WriteString("(?, ?, " + hb + ", " + q.now() + ")")
			args = append(args, id, userID, hbArg)
		}
		if err := q.g.Exec(sb.String(), args...).Error; err != nil {
			return nil, fmt.Errorf("seed workers: %w", mapErr(err))
		}
		sb.Reset()
		args = args[:0]
		sb.WriteString("INSERT INTO worker_job_links (worker_id, job_id) VALUES ")
		for i, id := range part {
			if i > 0 {
				sb.WriteString(", ")
			}
			sb.WriteString("(?, ?)")
			args = append(args, id, jobID)
		}
		if err := q.g.Exec(sb.String(), args...).Error; err != nil {
			return nil, fmt.Errorf("seed links: %w", mapErr(err))
		}
	}
	type task struct {
		worker uuid.UUID
		status string
	}
	tasks := make([]task, 0, n*tasksEach)
	for _, w := range ids {
		for k := range tasksEach {
			st := StatusClaimed
			if k%2 == 1 {
				st = StatusRunning
			}
			tasks = append(tasks, task{w, st})
		}
	}
	for start := 0; start < len(tasks); start += rows {
		part := tasks[start:min(start+rows, len(tasks))]
		var sb strings.Builder
		args := make([]any, 0, 5*len(part))
		sb.WriteString("INSERT INTO tasks (id, job_id, worker_id, room_id, status, attempt, created_at, claimed_at, updated_at) VALUES ")
		for i, t := range part {
			if i > 0 {
				sb.WriteString(", ")
			}
			sb.WriteString("(?, ?, ?, 'bench', ?, 1, " + q.now() + ", " + q.now() + ", " + q.now() + ")")
			args = append(args, uuid.New(), jobID, t.worker, t.status)
		}
		if err := q.g.Exec(sb.String(), args...).Error; err != nil {
			return nil, fmt.Errorf("seed tasks: %w", mapErr(err))
		}
	}
	return ids, nil
}

// SeedPendingTasks bulk-inserts n pending tasks of jobID in room (harnesses
// and tests; the server never calls it).
func (q *Q) SeedPendingTasks(jobID uuid.UUID, room string, n int) error {
	const rows = 1000
	for start := 0; start < n; start += rows {
		k := min(rows, n-start)
		var sb strings.Builder
		args := make([]any, 0, 3*k)
		sb.WriteString("INSERT INTO tasks (id, job_id, room_id, status, created_at, updated_at) VALUES ")
		for i := range k {
			if i > 0 {
				sb.WriteString(", ")
			}
			sb.WriteString("(?, ?, ?, 'pending', " + q.now() + ", " + q.now() + ")")
			args = append(args, uuid.New(), jobID, room)
		}
		if err := q.g.Exec(sb.String(), args...).Error; err != nil {
			return fmt.Errorf("seed pending tasks: %w", mapErr(err))
		}
	}
	return nil
}
