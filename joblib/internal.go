package joblib

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/startstop"
	"github.com/zndraw/joblib/models"
)

// Errors recorded on @internal tasks the executor could not finish.
const (
	// ErrInternalDispatch is the contract's error for a submission the
	// executor could not take (none running, or its queue full).
	ErrInternalDispatch = "Failed to dispatch to internal executor"
	// ErrInternalTimeout is the contract's error for an internal task that
	// ran longer than InternalTaskTimeout.
	ErrInternalTimeout = "Internal worker timeout"
	// ErrInternalStopped is recorded on internal tasks still queued or
	// running when the server shuts down.
	ErrInternalStopped = "Internal executor stopped"
)

// InternalJob is a job type executed inside the server (room @internal).
// Register it with Service.RegisterInternal before serving.
type InternalJob struct {
	Category string
	Name     string
	// Schema is the JSON Schema of the payload (nil: {}); clients read it
	// from the job listing. Payloads are not validated against it.
	Schema json.RawMessage
	// Handler runs one task under a deadline of InternalTaskTimeout and must
	// return when ctx ends. Its result (a JSON value, or nil) is stored on the
	// completed task; an error fails the task with the error's text.
	Handler func(ctx context.Context, t InternalTask) (json.RawMessage, error)
}

// FullName is @internal:category:name.
func (j InternalJob) FullName() string { return RoomInternal + ":" + j.Category + ":" + j.Name }

// InternalTask is what an internal handler receives.
type InternalTask struct {
	ID uuid.UUID
	// RoomID is the room the task was submitted to (its events go there).
	RoomID  string
	Payload json.RawMessage
}

// RegisterInternal makes an internal job type executable by this server. Call
// it before Start; EnsureInternalJobs then creates its job row.
func (s *Service) RegisterInternal(j InternalJob) error {
	if j.Category == "" || j.Name == "" || j.Handler == nil {
		return errors.New("internal job needs a category, a name and a handler")
	}
	if _, err := canonicalObject(j.Schema); err != nil {
		return fmt.Errorf("internal job %s: schema must be a JSON object", j.FullName())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.internal[j.FullName()] = j
	return nil
}

// InternalJobs lists the registered internal job types.
func (s *Service) InternalJobs() []InternalJob {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]InternalJob, 0, len(s.internal))
	for _, j := range s.internal {
		out = append(out, j)
	}
	return out
}

// EnsureInternalJobs creates, reactivates or updates the @internal job row of
// every registered internal job in one transaction (the schema is always
// overwritten, as the contract's ensure_internal_jobs does). Safe to run from
// several nodes at once: the upsert is a single conflict-tolerant statement.
func (s *Service) EnsureInternalJobs(ctx context.Context) error {
	jobs := s.InternalJobs()
	return s.db.Tx(ctx, func(q *models.Q) error {
		for _, j := range jobs {
			schema, err := canonicalObject(j.Schema)
			if err != nil {
				return err
			}
			row := models.Job{ID: uuid.New(), RoomID: RoomInternal, Category: j.Category, Name: j.Name, Schema: schema,
				OnWorkerLoss: OnWorkerLossFail, MaxAttempts: 1}
			if err := q.UpsertJobAlways(row); err != nil {
				return fmt.Errorf("ensure internal job %s: %w", j.FullName(), err)
			}
		}
		return nil
	})
}

func (s *Service) internalJob(fullName string) (InternalJob, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	j, ok := s.internal[fullName]
	return j, ok
}

// internalRunner is the bounded executor of @internal tasks: InternalWorkers
// goroutines and room for InternalQueue waiting tasks. A submission reserves
// a slot before its transaction commits, so the HTTP request never blocks:
// without a slot the task is stored failed instead.
type internalRunner struct {
	startstop.Base
	svc *Service

	mu        sync.Mutex
	accepting bool
	reserved  int // tasks queued or running, plus reservations not yet submitted
	capacity  int
	perUser   map[uuid.UUID]int // reserved, by submitter
	queue     chan internalItem
}

type internalItem struct {
	job  InternalJob
	task Task
	user uuid.UUID
}

func newInternalRunner(s *Service) *internalRunner {
	return &internalRunner{svc: s, perUser: map[uuid.UUID]int{}}
}

// Start runs the executor's workers.
func (r *internalRunner) Start(ctx context.Context) error {
	sctx, ok := r.StartInit(ctx)
	if !ok {
		return nil
	}
	st := r.svc.Settings()
	r.mu.Lock()
	r.capacity = st.InternalWorkers + st.InternalQueue
	r.queue = make(chan internalItem, r.capacity)
	r.reserved = 0
	r.accepting = true
	queue := r.queue
	r.mu.Unlock()
	for range st.InternalWorkers {
		r.Go(func() {
			for {
				select {
				case <-sctx.Done():
					return
				case it := <-queue:
					r.run(sctx, it)
					r.release(it.user)
				}
			}
		})
	}
	return nil
}

// Stop stops taking tasks, cancels the running ones and fails every task
// still queued (ErrInternalStopped), so none is left claimed with no executor.
func (r *internalRunner) Stop() {
	r.mu.Lock()
	r.accepting = false
	queue := r.queue
	r.mu.Unlock()
	r.Base.Stop()
	if queue == nil {
		return
	}
	for {
		select {
		case it := <-queue:
			r.svc.finishInternal(context.Background(), it.task.ID, models.StatusClaimed, models.StatusFailed, nil, ErrInternalStopped)
			r.release(it.user)
		default:
			return
		}
	}
}

// reserve takes a slot for a task user is about to submit. It reports
// shareSpent (and takes nothing) when user already holds perUser slots
// (0: no per-user share), so that one user cannot fill the executor.
func (r *internalRunner) reserve(user uuid.UUID, perUser int) (ok, shareSpent bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if perUser > 0 && r.perUser[user] >= perUser {
		return false, true
	}
	if !r.accepting || r.reserved >= r.capacity {
		return false, false
	}
	r.reserved++
	r.perUser[user]++
	return true, false
}

func (r *internalRunner) release(user uuid.UUID) {
	r.mu.Lock()
	r.reserved--
	if r.perUser[user]--; r.perUser[user] <= 0 {
		delete(r.perUser, user)
	}
	r.mu.Unlock()
}

// submit hands a committed task to a reserved slot. It never blocks: the
// queue holds as many items as there can be reservations.
func (r *internalRunner) submit(ctx context.Context, it internalItem) {
	r.mu.Lock()
	if r.accepting {
		r.queue <- it
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()
	r.release(it.user)
	// The executor stopped while the submission committed.
	r.svc.finishInternal(ctx, it.task.ID, models.StatusClaimed, models.StatusFailed, nil, ErrInternalStopped)
}

var errInternalTimeout = errors.New(ErrInternalTimeout)

// run executes one task: claimed → running → completed or failed, with the
// same task_status_event an external worker's PATCHes produce.
func (r *internalRunner) run(ctx context.Context, it internalItem) {
	s := r.svc
	if !s.finishInternal(ctx, it.task.ID, models.StatusClaimed, models.StatusRunning, nil, "") {
		return // cancelled (or failed by the stuck-task sweep) while queued
	}
	timeout := s.Settings().InternalTaskTimeout
	hctx, cancel := context.WithTimeoutCause(ctx, timeout, errInternalTimeout)
	defer cancel()
	type outcome struct {
		result json.RawMessage
		err    error
	}
	done := make(chan outcome, 1)
	go func() {
		defer func() {
			if v := recover(); v != nil {
				s.log.Error("internal job panicked", "job", it.job.FullName(), "task_id", it.task.ID, "panic", v, "stack", string(debug.Stack()))
				done <- outcome{err: fmt.Errorf("internal error: %v", v)}
			}
		}()
		res, err := it.job.Handler(hctx, InternalTask{ID: it.task.ID, RoomID: it.task.RoomID, Payload: it.task.Payload})
		done <- outcome{res, err}
	}()
	var o outcome
	finished := false
	select {
	case o = <-done:
		finished = true
	case <-hctx.Done():
	}
	cause := context.Cause(hctx)
	switch {
	case finished && o.err == nil:
		if o.result != nil && !json.Valid(o.result) {
			s.finishInternal(ctx, it.task.ID, models.StatusRunning, models.StatusFailed, nil, "internal job returned invalid JSON")
			return
		}
		s.finishInternal(ctx, it.task.ID, models.StatusRunning, models.StatusCompleted, o.result, "")
	case hctx.Err() != nil && errors.Is(cause, errInternalTimeout):
		s.finishInternal(ctx, it.task.ID, models.StatusRunning, models.StatusFailed, nil, ErrInternalTimeout)
		s.log.Warn("internal task timed out", "job", it.job.FullName(), "task_id", it.task.ID, "timeout", timeout)
		if !finished {
			// Keep the pool bounded: the slot frees when the handler
			// returns, or when the executor stops.
			select {
			case <-done:
			case <-ctx.Done():
			}
		}
	case hctx.Err() != nil && errors.Is(cause, startstop.ErrStop):
		s.finishInternal(ctx, it.task.ID, models.StatusRunning, models.StatusFailed, nil, ErrInternalStopped)
	default:
		s.finishInternal(ctx, it.task.ID, models.StatusRunning, models.StatusFailed, nil, o.err.Error())
	}
}

// finishInternal moves an internal task from one status to another if it is
// still there, stores the result or error, and publishes the task's event
// after commit. It reports whether the task moved. Its database writes are not
// cut short by the executor stopping.
func (s *Service) finishInternal(ctx context.Context, id uuid.UUID, from, to string, result json.RawMessage, errMsg string) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	moved := false
	err := s.mutate(ctx, func(q *models.Q, em *events.Set) error {
		var err error
		if to == models.StatusCompleted && result != nil {
			moved, err = q.CompleteTaskWithResult(id, from, string(result))
		} else {
			var msg *string
			if errMsg != "" {
				msg = &errMsg
			}
			moved, err = q.TransitionTask(id, from, to, nil, msg)
		}
		if err != nil || !moved {
			return err
		}
		t, err := q.GetTask(id)
		if err != nil {
			return err
		}
		em.Add(events.Room(t.RoomID), statusEvent(taskView(t)))
		return nil
	})
	if err != nil {
		s.log.Error("update internal task", "task_id", id, "from", from, "to", to, "err", err)
		return false
	}
	return moved
}
