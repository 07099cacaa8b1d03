package joblib

import (
	"cmp"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/models"
)

// Cleanup paths: who decided that a worker is gone. Recorded in the audit
// trail and in metrics.
const (
	PathGraceful   = "graceful"   // DELETE /workers/{id}
	PathDisconnect = "disconnect" // its socket closed and did not come back in the grace window
	PathSweeper    = "sweeper"    // its heartbeat is older than the worker timeout
	PathStartup    = "startup"    // its socket was held by a previous run of this node
	PathOperator   = "operator"   // joblib sweep --fix
)

// Paths lists every cleanup path (metrics pre-create their series from it).
var Paths = []string{PathGraceful, PathDisconnect, PathSweeper, PathStartup, PathOperator, PathNode}

// ErrWorkerDisconnected is the error recorded on tasks failed by a cleanup.
const ErrWorkerDisconnected = "Worker disconnected"

// CleanupParams say why a cleanup runs and under which condition.
type CleanupParams struct {
	Path string
	// Fence is re-checked under the worker's row lock; a worker for which it
	// no longer holds is left alone (it heartbeated, reconnected, or another
	// path cleaned it first).
	Fence   models.CleanupFence
	SweepID *uuid.UUID
}

// CleanupResult is what a cleanup did.
type CleanupResult struct {
	// Cleaned is the number of workers removed (0 when the fence did not hold
	// or the worker was already gone).
	Cleaned       int
	TasksFailed   int
	TasksRequeued int
	OrphanJobs    int
	// FrameRooms are the rooms that lost a provider of category "frames".
	FrameRooms []string
	// Workers are the removed workers with their evidence.
	Workers []models.CleanedWorker
	// The failed and requeued tasks are not kept here: their events carry
	// them, built per transaction, and a sweep's result holding a copy of
	// every task it released (50,000 views, grown batch by batch) cost it a
	// fifth of its CPU time.
}

func (r *CleanupResult) add(out models.CleanupOutcome) {
	r.Cleaned += len(out.Workers)
	r.OrphanJobs += len(out.OrphanJobs)
	r.Workers = append(r.Workers, out.Workers...)
	for _, w := range out.Workers {
		r.TasksFailed += w.TasksFailed
		r.TasksRequeued += w.TasksRequeued
		for _, fr := range w.FrameRooms {
			r.FrameRooms = appendUniqueStr(r.FrameRooms, fr)
		}
	}
}

// CleanupObserver is told about every cleanup that removed something, after
// commit (metrics, logs). It runs on the caller's goroutine and must not block.
type CleanupObserver func(path string, r CleanupResult)

// CleanupWorker is the one cascade every path converges on: it fails (or
// requeues, per job policy) the worker's claimed and running tasks, removes
// its providers and links, deletes it, soft-deletes the jobs left orphaned,
// writes the audit trail, and publishes the events once, after commit. Two
// callers racing on one worker produce exactly one cleanup.
func (s *Service) CleanupWorker(ctx context.Context, id uuid.UUID, p CleanupParams) (CleanupResult, error) {
	return s.CleanupWorkers(ctx, []uuid.UUID{id}, p)
}

// CleanupWorkers is CleanupWorker for many workers: one transaction with a
// constant number of statements per models.MaxCleanupBatch workers. When a
// later batch fails, the earlier ones stay committed and are reported.
func (s *Service) CleanupWorkers(ctx context.Context, ids []uuid.UUID, p CleanupParams) (CleanupResult, error) {
	var res CleanupResult
	for start := 0; start < len(ids); start += models.MaxCleanupBatch {
		part := ids[start:min(start+models.MaxCleanupBatch, len(ids))]
		r, err := s.cleanupTx(ctx, p, func(q *models.Q) (models.CleanupOutcome, error) {
			return q.CleanupWorkers(part, p.Fence, ErrWorkerDisconnected, models.CleanupAudit{Path: p.Path, SweepID: p.SweepID})
		})
		res.merge(r)
		if err != nil {
			s.observe(p.Path, res)
			return res, err
		}
	}
	s.observe(p.Path, res)
	return res, nil
}

// cleanupMatching cleans the first limit workers that satisfy p.Fence in one
// transaction.
func (s *Service) cleanupMatching(ctx context.Context, p CleanupParams, limit int) (CleanupResult, error) {
	return s.cleanupTx(ctx, p, func(q *models.Q) (models.CleanupOutcome, error) {
		return q.CleanupMatching(p.Fence, limit, ErrWorkerDisconnected, models.CleanupAudit{Path: p.Path, SweepID: p.SweepID})
	})
}

func (s *Service) cleanupTx(ctx context.Context, p CleanupParams, fn func(q *models.Q) (models.CleanupOutcome, error)) (CleanupResult, error) {
	var res CleanupResult
	start := time.Now()
	err := s.mutate(ctx, func(q *models.Q, em *events.Set) error {
		out, err := fn(q)
		if err != nil {
			return err
		}
		res = CleanupResult{}
		res.add(out)
		cleanupEmissions(out, em)
		return nil
	})
	if err != nil {
		return CleanupResult{}, err
	}
	if res.Cleaned > 0 {
		s.log.Info("workers cleaned up", "path", p.Path, "workers", res.Cleaned, "tasks_failed", res.TasksFailed,
			"tasks_requeued", res.TasksRequeued, "orphan_jobs", res.OrphanJobs, "took", time.Since(start))
	}
	return res, nil
}

func (r *CleanupResult) merge(o CleanupResult) {
	r.Cleaned += o.Cleaned
	r.TasksFailed += o.TasksFailed
	r.TasksRequeued += o.TasksRequeued
	r.OrphanJobs += o.OrphanJobs
	for _, fr := range o.FrameRooms {
		r.FrameRooms = appendUniqueStr(r.FrameRooms, fr)
	}
	r.Workers = append(r.Workers, o.Workers...)
}

// observe tells the observers about a cleanup that removed something.
func (s *Service) observe(path string, r CleanupResult) {
	if r.Cleaned == 0 {
		return
	}
	s.mu.RLock()
	obs := s.observers
	s.mu.RUnlock()
	for _, o := range obs {
		o(path, r)
	}
}

// OnCleanup registers an observer for completed cleanups.
func (s *Service) OnCleanup(o CleanupObserver) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.observers = append(s.observers, o)
}

// cleanupEmissions builds the events of contract §6.2 for a cleanup.
func cleanupEmissions(out models.CleanupOutcome, em *events.Set) {
	for _, t := range out.Tasks {
		addTaskChanged(em, taskView(t))
	}
	for _, w := range out.Workers {
		for _, r := range w.LinkedJobRooms {
			em.Add(events.Room(r), events.JobsInvalidate{})
		}
		for _, r := range w.ProviderRooms {
			em.Add(events.Room(r), events.ProvidersInvalidate{})
		}
	}
	for _, j := range out.OrphanJobs {
		em.Add(events.Room(j.RoomID), events.JobsInvalidate{})
	}
}

func appendUniqueStr(s []string, v string) []string {
	for _, x := range s {
		if x == v {
			return s
		}
	}
	return append(s, v)
}

// SweepParams configure one sweep.
type SweepParams struct {
	// Path is PathSweeper (the background sweeper) or PathOperator (joblib
	// sweep --fix). Default PathSweeper.
	Path string
	// Threshold: workers whose last heartbeat is older than this by the
	// database's clock are stale. Default Settings.WorkerTimeout.
	Threshold time.Duration
	// DryRun plans the sweep in a transaction that is rolled back: nothing
	// changes and nothing is published or audited.
	DryRun bool
	// Cap applies the blast-radius cap of Settings.SweepMaxFraction. When it
	// holds the sweep back, the report says Capped and, with RecordShadow,
	// the plan is written to the audit trail as shadow rows.
	Cap          bool
	RecordShadow bool
	// Leader fences every statement to the sweeper leadership held with
	// this epoch (zero: unfenced, for operators).
	Leader LeaderFence
}

// SweepReport is what one sweep did, or would do.
type SweepReport struct {
	SweepID   uuid.UUID
	Path      string
	Threshold time.Duration
	DryRun    bool
	// Capped: more workers were stale than the cap allows; nothing was
	// cleaned and Result is the plan that was held back.
	Capped bool
	// StaleWorkers and TotalWorkers are counted when the cap is on and
	// some worker is stale.
	StaleWorkers, TotalWorkers int64
	// Result is the workers cleaned (or, for a dry run or a capped sweep,
	// the workers that would be).
	Result CleanupResult
	// StuckInternal are the @internal tasks failed (or that would be) for
	// running longer than Settings.InternalTaskTimeout.
	StuckInternal []Task
	// TimedOut are the tasks failed or requeued for passing their
	// deadline (task_timeout or heartbeat_timeout).
	TimedOut []TimedOutTask
	Took     time.Duration
}

// sweepLanes is how many batch transactions a sweep runs at once. Two keep
// both the database and this process busy (a batch alternates between
// them); on SQLite, with its one connection, they simply take turns.
const sweepLanes = 2

// errRollback ends a dry-run transaction.
var errRollback = errors.New("dry run: roll back")

// Sweep cleans every worker whose last heartbeat is older than the threshold
// by the database's clock, in batches of Settings.SweepBatchSize (one
// transaction each, sweepLanes at a time, rows skipped while another
// transaction holds them), then
// fails @internal tasks stuck past Settings.InternalTaskTimeout (contract
// §6.5), then times out tasks past their deadline (TimeOutTasks). Each
// batch's events are published after its commit.
func (s *Service) Sweep(ctx context.Context, p SweepParams) (SweepReport, error) {
	st := s.Settings()
	start := time.Now()
	rep := SweepReport{SweepID: uuid.New(), Path: cmp.Or(p.Path, PathSweeper), Threshold: p.Threshold, DryRun: p.DryRun}
	if rep.Threshold <= 0 {
		rep.Threshold = st.WorkerTimeout
	}
	fence := models.CleanupFence{StaleAfter: rep.Threshold, SkipLocked: true, Leader: p.Leader}
	params := CleanupParams{Path: rep.Path, Fence: fence, SweepID: &rep.SweepID}

	// One read says whether there is anything to do: an idle sweep ends
	// here. The fences are checked again under the row locks below.
	probe, err := s.db.Q(ctx).ProbeSweep(rep.Threshold, st.InternalTaskTimeout)
	if err != nil {
		return rep, err
	}
	if !probe.Stale && !probe.Stuck && !probe.TimedOut {
		rep.Took = time.Since(start)
		return rep, nil
	}
	if probe.Stale && p.Cap && st.SweepMaxFraction > 0 {
		stale, total, err := s.db.Q(ctx).CountWorkers(rep.Threshold)
		if err != nil {
			return rep, err
		}
		rep.StaleWorkers, rep.TotalWorkers = stale, total
		if stale > int64(st.SweepCapMinWorkers) && float64(stale) > st.SweepMaxFraction*float64(total) {
			rep.Capped = true
			plan, err := s.planSweep(ctx, fence, st, params, p.RecordShadow)
			rep.Result, rep.StuckInternal, rep.Took = plan.Result, plan.StuckInternal, time.Since(start)
			return rep, err
		}
	}
	if p.DryRun {
		plan, err := s.planSweep(ctx, fence, st, params, false)
		rep.Result, rep.StuckInternal, rep.Took = plan.Result, plan.StuckInternal, time.Since(start)
		return rep, err
	}
	if probe.Stale {
		// sweepLanes batches at a time: one transaction's statements run
		// in the database while another's rows are read and its events
		// built here. SKIP LOCKED gives each lane its own workers; the job
		// rows two lanes share are locked in id order (see
		// models.SoftDeleteOrphanJobs), as for any two concurrent cleanups.
		var mu sync.Mutex
		var firstErr error
		var wg sync.WaitGroup
		for range sweepLanes {
			wg.Go(func() {
				for ctx.Err() == nil {
					r, err := s.cleanupMatching(ctx, params, st.SweepBatchSize)
					mu.Lock()
					rep.Result.merge(r)
					if err != nil && firstErr == nil {
						firstErr = err
					}
					stop := firstErr != nil
					mu.Unlock()
					if stop || r.Cleaned < st.SweepBatchSize {
						return
					}
				}
			})
		}
		wg.Wait()
		if firstErr != nil {
			s.observe(rep.Path, rep.Result)
			rep.Took = time.Since(start)
			return rep, firstErr
		}
	}
	s.observe(rep.Path, rep.Result)
	if probe.Stuck {
		stuck, err := s.failStuckInternal(ctx, st.InternalTaskTimeout, p.Leader)
		rep.StuckInternal = stuck
		if err != nil {
			rep.Took = time.Since(start)
			return rep, err
		}
	}
	if probe.TimedOut {
		timedOut, err := s.TimeOutTasks(ctx, &rep.SweepID, p.Leader)
		rep.TimedOut = timedOut
		if err != nil {
			rep.Took = time.Since(start)
			return rep, err
		}
	}
	rep.Took = time.Since(start)
	return rep, nil
}

// planSweep runs a whole sweep in one transaction and rolls it back. With
// shadow, the plan's audit rows are then written, marked shadow.
func (s *Service) planSweep(ctx context.Context, fence models.CleanupFence, st Settings, p CleanupParams, shadow bool) (SweepReport, error) {
	var rep SweepReport
	var outs []models.CleanupOutcome
	err := s.db.Tx(ctx, func(q *models.Q) error {
		rep, outs = SweepReport{}, nil
		for {
			out, err := q.CleanupMatching(fence, st.SweepBatchSize, ErrWorkerDisconnected, models.CleanupAudit{Path: p.Path, SweepID: p.SweepID})
			if err != nil {
				return err
			}
			outs = append(outs, out)
			rep.Result.add(out)
			if len(out.Workers) < st.SweepBatchSize {
				break
			}
		}
		ts, err := q.FailStuckInternalTasks(st.InternalTaskTimeout, ErrInternalTimeout, fence.Leader)
		if err != nil {
			return err
		}
		for _, t := range ts {
			rep.StuckInternal = append(rep.StuckInternal, taskView(t))
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		return rep, err
	}
	if shadow && rep.Result.Cleaned > 0 {
		err := s.db.Tx(ctx, func(q *models.Q) error {
			for _, out := range outs {
				if err := q.RecordShadowCleanup(out, fence, models.CleanupAudit{Path: p.Path, SweepID: p.SweepID}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// failStuckInternal fails @internal tasks claimed or running for longer than
// timeout (contract §6.5) and publishes their status events.
func (s *Service) failStuckInternal(ctx context.Context, timeout time.Duration, lead LeaderFence) ([]Task, error) {
	var out []Task
	err := s.mutate(ctx, func(q *models.Q, em *events.Set) error {
		out = nil
		ts, err := q.FailStuckInternalTasks(timeout, ErrInternalTimeout, lead)
		if err != nil {
			return err
		}
		for _, t := range ts {
			v := taskView(t)
			out = append(out, v)
			em.Add(events.Room(v.RoomID), statusEvent(v))
		}
		return nil
	})
	if len(out) > 0 {
		s.log.Warn("stuck internal tasks failed", "tasks", len(out), "timeout", timeout)
	}
	return out, err
}

// PurgeAudit deletes audit rows older than Settings.AuditRetention (none when
// it is 0), in bounded batches, and returns how many; lead fences it to the
// sweeper leader.
func (s *Service) PurgeAudit(ctx context.Context, lead LeaderFence) (int64, error) {
	ret := s.Settings().AuditRetention
	if ret <= 0 {
		return 0, nil
	}
	var total int64
	for {
		n, err := s.db.Q(ctx).PurgeAudit(ret, 10000, lead)
		total += n
		if err != nil || n < 10000 {
			return total, err
		}
	}
}
