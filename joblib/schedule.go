package joblib

import (
	"context"
	"math"
	"math/rand/v2"
	"time"

	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/models"
)

// Delayed tasks. A task submitted with a run_at in the future (or a delay),
// and a failed attempt its job retries after a backoff, is stored pending
// and delayed: no claim reads it (claims walk an index of the claimable
// tasks only). The sweeper's leader keeps one timer armed at the earliest
// run_at (one read of the first entry of an index, on the database clock);
// when it fires, PromoteDueTasks makes the due tasks claimable and sends
// task_available to their jobs' workers. The timer is re-armed at each of
// the leader's probes and whenever a delayed task is created (a kick: on
// this node directly, from other nodes through the bus, by the task's
// status event), so nobody polls the tasks.

// scheduler is the kick of the leader's timer.
type scheduler struct{ kicks chan struct{} }

func newScheduler() *scheduler { return &scheduler{kicks: make(chan struct{}, 1)} }

// kick asks the leader's timer to re-read the earliest run_at.
func (sc *scheduler) kick() {
	select {
	case sc.kicks <- struct{}{}:
	default:
	}
}

// observe is the bus subscriber: a pending task without a queue position
// is a delayed one, possibly due before the armed timer.
func (sc *scheduler) observe(e events.Emission) {
	if ev, ok := e.Event.(events.TaskStatusEvent); ok && ev.Status == models.StatusPending && ev.QueuePosition == nil {
		sc.kick()
	}
}

// retryJitter is the largest share added at random to a backoff, so that
// the tasks of one outage do not all come back at the same instant.
const retryJitter = 0.1

// retryDelay is the backoff in seconds before the next attempt of a task
// whose attempt n (1 for the first) failed: min(maxBackoff, backoff ×
// 2^(n-1)), plus up to retryJitter of it. Never less than the unjittered
// value.
func retryDelay(backoff, maxBackoff float64, n int) float64 {
	d := backoff * math.Pow(2, float64(max(n, 1)-1))
	d = min(d, maxBackoff)
	return d * (1 + retryJitter*rand.Float64())
}

// PromoteDueTasks makes the delayed tasks whose run_at has passed on the
// database's clock claimable, in batches of Settings.SweepBatchSize, and
// sends each one's status event to its room and task_available to its
// job's workers, after each batch's commit. The sweeper's leader calls it
// with its fence: a leader that lost the lease promotes nothing.
func (s *Service) PromoteDueTasks(ctx context.Context, fence LeaderFence) ([]Task, error) {
	return leaderBatches(ctx, s, func(q *models.Q, em *events.Set, batch int) ([]Task, error) {
		ts, err := q.PromoteDueTasks(batch, fence)
		if err != nil {
			return nil, err
		}
		out := make([]Task, 0, len(ts))
		for _, t := range ts {
			v := taskView(t)
			out = append(out, v)
			addTaskChanged(em, v)
		}
		return out, nil
	})
}

// leaderBatches runs one of the leader's sweeps over tasks a batch at a
// time (Settings.SweepBatchSize, one transaction each, whose events go out
// after its commit) until a batch comes back short, and returns what every
// batch changed.
func leaderBatches[T any](ctx context.Context, s *Service, one func(q *models.Q, em *events.Set, batch int) ([]T, error)) ([]T, error) {
	batch := max(1, min(s.Settings().SweepBatchSize, models.MaxCleanupBatch))
	var all []T
	for ctx.Err() == nil {
		var out []T
		err := s.mutate(ctx, func(q *models.Q, em *events.Set) error {
			var err error
			out, err = one(q, em, batch)
			return err
		})
		if err != nil {
			return all, err
		}
		all = append(all, out...)
		if len(out) < batch {
			break
		}
	}
	return all, ctx.Err()
}

// NextRunAt is how long until the earliest delayed task is due, by the
// database's clock; ok is false when no task is delayed.
func (s *Service) NextRunAt(ctx context.Context) (time.Duration, bool, error) {
	at, now, ok, err := s.db.Q(ctx).NextRunAt()
	if err != nil || !ok {
		return 0, false, err
	}
	return max(at.Sub(now.Time), 0), true, nil
}
