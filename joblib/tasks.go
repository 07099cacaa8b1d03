package joblib

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/limits"
	"github.com/zndraw/joblib/internal/taskstatus"
	"github.com/zndraw/joblib/models"
)

// ValidStatus reports whether s is one of the six task statuses
// (taskstatus.Valid).
func ValidStatus(s string) bool { return taskstatus.Valid(s) }

// SubmitTask creates a task for a job, addressed by full name, in a target
// room. Any room may submit to any job.
func (s *Service) SubmitTask(ctx context.Context, p Principal, room, fullName string, payload json.RawMessage) (Task, error) {
	return s.SubmitTaskWith(ctx, p, room, fullName, payload, SubmitOptions{})
}

// SubmitOptions are the optional fields of a submission.
type SubmitOptions struct {
	// Timeout is the task's own task_timeout in seconds (nil: the job's).
	Timeout *int
	// Sched is the task's priority and the time it may run from.
	Sched models.TaskSched
}

// Priority bounds of a submission.
const (
	MinPriority = -100
	MaxPriority = 100
)

// maxDelay bounds a submission's delay, and how far ahead its run_at may
// be (a year).
const maxDelay = 365 * 24 * time.Hour

// checkSched validates a submission's priority, run_at and delay (field
// prefixes the names in the error).
func checkSched(field string, s models.TaskSched) error {
	if s.Priority < MinPriority || s.Priority > MaxPriority {
		return errf(CodeValidation, "%spriority must be an integer from %d to %d, got %d", field, MinPriority, MaxPriority, s.Priority)
	}
	if s.RunAt != nil && s.Delay != nil {
		return errf(CodeValidation, "%srun_at and %sdelay are exclusive; give one", field, field)
	}
	if s.Delay != nil && !(*s.Delay >= 0 && *s.Delay <= maxDelay.Seconds()) {
		return errf(CodeValidation, "%sdelay must be from 0 to %.0f seconds", field, maxDelay.Seconds())
	}
	if s.RunAt != nil && (s.RunAt.Year() < 1970 || time.Until(*s.RunAt) > maxDelay) {
		return errf(CodeValidation, "%srun_at must be a time from 1970 to one year ahead", field)
	}
	return nil
}

// waits reports whether a submission may leave its task delayed.
func waits(s models.TaskSched) bool { return s.RunAt != nil || s.Delay != nil && *s.Delay > 0 }

// SubmitTaskWith is SubmitTask with options.
func (s *Service) SubmitTaskWith(ctx context.Context, p Principal, room, fullName string, payload json.RawMessage, o SubmitOptions) (Task, error) {
	if err := ValidateRoomID(room); err != nil {
		return Task{}, err
	}
	if err := checkTimeout("timeout", o.Timeout); err != nil {
		return Task{}, err
	}
	if err := checkSched("", o.Sched); err != nil {
		return Task{}, err
	}
	body, err := canonicalObject(payload)
	if err != nil {
		if e, ok := AsError(err); ok {
			e.Detail = "payload must be a JSON object"
		}
		return Task{}, err
	}
	if err := allow(s.rates.submit, p, limits.SubmitRate, "task submissions"); err != nil {
		return Task{}, err
	}
	if strings.HasPrefix(fullName, RoomInternal+":") {
		if err := allow(s.rates.internal, p, limits.InternalRate, "@internal task submissions"); err != nil {
			return Task{}, err
		}
	}
	if o.Sched == (models.TaskSched{}) {
		// The one-statement path adds priority 0 tasks claimable at once.
		if t, ok, err := s.submitHot(ctx, p, room, fullName, body, o.Timeout); err != nil || ok {
			return t, err
		}
	}
	var sub submitState
	var tasks []Task
	err = s.mutate(ctx, func(q *models.Q, em *events.Set) error {
		var err error
		tasks, err = s.insertSubmission(q, em, p, room, fullName, []string{body}, []*int{o.Timeout}, []models.TaskSched{o.Sched}, &sub)
		return err
	})
	return s.afterSubmission(ctx, p, tasks, &sub, err)
}

// submitState is what one submission's transaction leaves for after the
// commit: an @internal task's executor slot.
type submitState struct {
	internal InternalJob
	reserved bool // an executor slot is held for this task
	delayed  bool // a task waits for its run_at: the scheduler re-arms
}

// insertSubmission creates the tasks of one submission (one per body) in
// q's transaction, with their events in em: the pending-task quota counts
// them all, so a batch is refused whole. An @internal job takes one task
// per submission (its executor slot is reserved in st).
func (s *Service) insertSubmission(q *models.Q, em *events.Set, p Principal, room, fullName string, bodies []string, timeouts []*int, scheds []models.TaskSched, st *submitState) ([]Task, error) {
	// Key-share: the orphan rule cannot soft-delete the job under the
	// pending tasks we are adding.
	j, err := resolveJobLocked(q, fullName, models.KeyShare)
	if err != nil {
		return nil, err
	}
	creator := p.ID
	if j.RoomID != RoomInternal {
		if err := s.checkQuotaAdd(q, p, models.UsagePendingTasks, len(bodies)); err != nil {
			return nil, err
		}
		var ts []models.Task
		if len(bodies) == 1 {
			// One row: its queue position is one count over the index, cheaper
			// than ranking the job's queue as a batch's read-back does.
			t, err := q.InsertTaskSched(uuid.New(), j.ID, room, &creator, bodies[0], models.StatusPending, timeouts[0], scheds[0])
			if err != nil {
				return nil, err
			}
			ts = []models.Task{t}
		} else {
			ids := make([]uuid.UUID, len(bodies))
			for i := range ids {
				ids[i] = uuid.New()
			}
			if ts, err = q.InsertTasks(ids, j.ID, room, &creator, bodies, timeouts, scheds, models.StatusPending); err != nil {
				return nil, err
			}
		}
		tasks := make([]Task, len(ts))
		for i, t := range ts {
			tasks[i] = taskView(t)
			em.Add(events.Room(room), statusEvent(tasks[i]))
			if t.Delayed {
				// Its task_available goes out when it is due (PromoteDueTasks).
				st.delayed = true
				continue
			}
			em.Add(events.JobRoom(j.FullName()), events.TaskAvailable{JobName: j.FullName(), RoomID: room, TaskID: tasks[i].ID.String()})
		}
		return tasks, nil
	}
	if len(bodies) != 1 {
		return nil, errf(CodeValidation, "a batch cannot submit to the @internal job '%s'; submit its tasks one by one", j.FullName())
	}
	if scheds[0] != (models.TaskSched{}) {
		return nil, errf(CodeValidation, "an @internal job's task runs at once: priority, run_at and delay are not accepted for '%s'", j.FullName())
	}
	body := bodies[0]
	var ok bool
	if st.internal, ok = s.internalJob(j.FullName()); !ok {
		return nil, errf(CodeInternalJobNotConfigured, "Internal job '%s' is registered but no executor is available", j.FullName())
	}
	// The server itself claims internal tasks; no worker ever sees them.
	if !st.reserved {
		perUser := s.Settings().InternalQueuePerUser
		var shareSpent bool
		if st.reserved, shareSpent = s.runner.reserve(p.ID, perUser); shareSpent {
			return nil, limitErr(CodeRateLimited, limits.InternalQueueShare, time.Second,
				"%d of your @internal tasks are already queued or running; submit more when they finish", perUser)
		}
	}
	id := uuid.New()
	if !st.reserved {
		// The executor cannot take it (stopped, or its queue is full): the
		// contract's dispatch failure — stored failed, answered 202
		// without Location, no events.
		if _, err := q.InsertTask(id, j.ID, room, &creator, body, models.StatusPending); err != nil {
			return nil, err
		}
		msg := ErrInternalDispatch
		if _, err := q.TransitionTask(id, models.StatusPending, models.StatusFailed, nil, &msg); err != nil {
			return nil, err
		}
		t, err := q.GetTask(id)
		return []Task{taskView(t)}, err
	}
	t, err := q.InsertTaskTimeout(id, j.ID, room, &creator, body, models.StatusClaimed, timeouts[0])
	if err != nil {
		return nil, err
	}
	task := taskView(t)
	em.Add(events.Room(room), statusEvent(task))
	return []Task{task}, nil
}

// afterSubmission releases or hands on an @internal task's executor slot
// once the submission's transaction ended with err.
func (s *Service) afterSubmission(ctx context.Context, p Principal, tasks []Task, st *submitState, err error) (Task, error) {
	if err != nil {
		if st.reserved {
			s.runner.release(p.ID)
		}
		return Task{}, err
	}
	if st.delayed {
		s.sched.kick()
	}
	if st.reserved {
		s.runner.submit(ctx, internalItem{job: st.internal, task: tasks[0], user: p.ID})
	}
	return tasks[0], nil
}

// submitHot is SubmitTask's one-statement path on PostgreSQL for a live job
// that is not @internal, with the pending-task quota checked under the
// user's quota lock in the same round trip; ok is false when it does not
// apply (the general path then answers: not found, internal jobs, quota
// exceeded).
func (s *Service) submitHot(ctx context.Context, p Principal, room, fullName, body string, timeout *int) (Task, bool, error) {
	if !s.db.Caps().HotPath {
		return Task{}, false, nil
	}
	quota := s.Settings().quotaFor(models.UsagePendingTasks)
	if p.Superuser {
		quota = 0
	}
	jroom, cat, name, ok := SplitFullName(fullName)
	if !ok || !addressable(jroom, cat, name) || jroom == RoomInternal {
		return Task{}, false, nil
	}
	n := s.hotNotify()
	a := models.AvailableFrame{Middle: events.EventMiddle(events.TaskAvailable{}.EventName()), JobRoomPrefix: events.JobRoom("")}
	ht, ok, err := s.db.SubmitTaskHot(ctx, uuid.New(), jroom, cat, name, room, p.ID, body, timeout, quota, n, a)
	if err != nil || !ok {
		return Task{}, false, err
	}
	task := taskView(ht.Task)
	ems := []events.Emission{
		{Room: events.Room(room), Event: statusEvent(task)},
		{Room: events.JobRoom(task.JobName), Event: events.TaskAvailable{JobName: task.JobName, RoomID: room, TaskID: task.ID.String()}},
	}
	if tb := s.txBus(); tb != nil {
		tb.Deliver(ems)
		if ht.Notified {
			s.relay.pokeFrames(ht.Frame) // the statement writes both events or neither
		} else {
			s.notifyLate(ctx, tb, ems)
		}
	} else {
		s.publish(ctx, ems)
	}
	return task, true, nil
}

// ClaimTask claims the oldest pending task of the worker's jobs. It returns
// nil when nothing is claimable.
func (s *Service) ClaimTask(ctx context.Context, p Principal, workerID uuid.UUID) (*Task, error) {
	ts, err := s.ClaimTasks(ctx, p, workerID, 1, false)
	if err != nil || len(ts) == 0 {
		return nil, err
	}
	return &ts[0], nil
}

// MaxClaimBatch is the most tasks one batch claim may take.
const MaxClaimBatch = 100

// ClaimTasks claims up to limit (1..MaxClaimBatch) of the oldest pending
// tasks of the worker's jobs, oldest first; none when nothing is claimable.
// Every task goes to exactly one claimer, however many claim at once. With
// start the tasks are claimed and started in one step: they come back
// running, as a claim followed at once by a report of running would leave
// them, with one write and one task_status_event per task instead of two.
func (s *Service) ClaimTasks(ctx context.Context, p Principal, workerID uuid.UUID, limit int, start bool) ([]Task, error) {
	if limit < 1 || limit > MaxClaimBatch {
		return nil, errf(CodeValidation, "limit must be between 1 and %d", MaxClaimBatch)
	}
	if s.db.Caps().HotPath {
		owned, hts, err := s.claimHot(ctx, p.ID, workerID, limit, start)
		if err != nil {
			return nil, err
		}
		if owned {
			for _, ht := range hts {
				s.recordClaims([]models.Task{ht.Task})
			}
			return s.publishHot(ctx, hts), nil
		}
		// Not the caller's worker, or none: the general path says which.
	}
	var out []Task
	var claimed []models.Task
	err := s.mutate(ctx, func(q *models.Q, em *events.Set) error {
		out = nil
		// Locked so that a concurrent cleanup of the worker cannot miss the
		// task claimed here and leave it claimed by a deleted worker.
		w, err := q.LockWorker(workerID)
		if err != nil {
			return notFound(err, errf(CodeWorkerNotFound, "Worker %s not found", workerID))
		}
		if w.UserID != p.ID {
			return errf(CodeForbidden, "Worker belongs to a different user")
		}
		ts, err := q.ClaimTasks(workerID, limit, start)
		if err != nil {
			return err
		}
		claimed = ts
		for _, t := range ts {
			v := taskView(t)
			out = append(out, v)
			em.Add(events.Room(v.RoomID), statusEvent(v))
		}
		return nil
	})
	if err == nil {
		s.recordClaims(claimed)
	}
	return out, err
}

// GetTask reads a task.
func (s *Service) GetTask(ctx context.Context, id uuid.UUID) (Task, error) {
	t, err := s.db.Q(ctx).GetTask(id)
	if err != nil {
		return Task{}, notFound(err, errf(CodeTaskNotFound, "Task '%s' not found", id))
	}
	return taskView(t), nil
}

// WaitTask reads a task and, if it is not terminal, waits up to wait (capped
// by LongPollMaxWait) for it to become terminal. It is woken by the task's
// change itself, not by polling. waited reports whether a wait happened
// (the caller then answers Preference-Applied with the effective wait).
func (s *Service) WaitTask(ctx context.Context, id uuid.UUID, wait time.Duration) (t Task, effective time.Duration, waited bool, err error) {
	if wait <= 0 {
		t, err = s.GetTask(ctx, id)
		return t, 0, false, err
	}
	effective = min(wait, s.Settings().LongPollMaxWait)
	changed, stop := s.watch.Subscribe(id)
	defer stop()
	if t, err = s.GetTask(ctx, id); err != nil || t.Terminal() {
		return t, 0, false, err
	}
	timer := time.NewTimer(effective)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return t, effective, true, ctx.Err()
		case <-timer.C:
			t, err = s.GetTask(ctx, id)
			return t, effective, true, err
		case <-s.draining:
			t, err = s.GetTask(ctx, id)
			return t, effective, true, err
		case <-changed:
			if t, err = s.GetTask(ctx, id); err != nil || t.Terminal() {
				return t, effective, true, err
			}
		}
	}
}

// hotErrorMax bounds the error text the one-statement update carries (its
// event must fit a NOTIFY); longer ones take the general path.
const hotErrorMax = 2000

// UpdateTask applies a status transition (PATCH /tasks/{id}).
func (s *Service) UpdateTask(ctx context.Context, p Principal, id uuid.UUID, status string, errMsg *string) (Task, error) {
	return s.UpdateTaskResult(ctx, p, id, status, errMsg, nil)
}

// UpdateTaskResult is UpdateTask with the worker's result: a JSON value
// stored with a transition to completed (and returned by GetTask as
// `result`), at most TaskMaxResultBytes once compacted. A result sent with
// any other status is ignored, as the Python server ignores fields it does
// not know; JSON null counts as no result.
func (s *Service) UpdateTaskResult(ctx context.Context, p Principal, id uuid.UUID, status string, errMsg *string, result json.RawMessage) (Task, error) {
	return s.UpdateTaskReport(ctx, p, TaskUpdate{TaskID: id, Status: status, Error: errMsg, Result: result})
}

// UpdateTaskReport is UpdateTaskResult with every field of a report: with
// NoRetry a failed report is final even when the task's job retries.
func (s *Service) UpdateTaskReport(ctx context.Context, p Principal, u TaskUpdate) (Task, error) {
	id, status, errMsg, result := u.TaskID, u.Status, u.Error, u.Result
	stored, err := s.checkUpdate(status, errMsg, result)
	if err != nil {
		return Task{}, err
	}
	if taskstatus.Terminal(status) {
		s.progress.flush(id) // its last progress goes before its end
	}
	if s.hotEligible(status, errMsg) {
		// Sent with the other reports that wait meanwhile, of any user
		// (see reportBatcher).
		ht, err := s.reports.report(ctx, toHotUpdate(p.ID, id, status, errMsg, stored))
		if err != nil {
			return Task{}, err
		}
		if ht != nil {
			return s.publishHot(ctx, []models.HotTask{*ht})[0], nil
		}
		// Missing, not held by a worker of the caller's (a superuser's
		// override is audited there), lost or in another state: the general
		// path gives the precise answer (or applies a change that raced in).
	}
	return s.updateTask(ctx, p, id, status, errMsg, stored, u.NoRetry)
}

// checkUpdate validates a status report and returns the result to store
// with it (nil: none).
func (s *Service) checkUpdate(status string, errMsg *string, result json.RawMessage) (*string, error) {
	var stored *string
	if status == models.StatusCompleted && len(result) > 0 {
		var buf bytes.Buffer
		if err := json.Compact(&buf, result); err != nil {
			return nil, errf(CodeValidation, "result must be JSON: %v", err)
		}
		if max := s.Settings().TaskMaxResultBytes; int64(buf.Len()) > max {
			return nil, errf(CodePayloadTooLarge, "task result exceeds %d bytes", max)
		}
		if r := buf.String(); r != "null" {
			stored = &r
		}
	}
	if !ValidStatus(status) {
		return nil, errf(CodeValidation, "status must be one of pending, claimed, running, completed, failed, cancelled")
	}
	if errMsg != nil {
		if err := validateText("error", *errMsg, 0); err != nil {
			return nil, err
		}
	}
	return stored, nil
}

// hotEligible reports whether a status report may take the one-statement path:
// on PostgreSQL, a worker's report (a task is made claimed only by a claim,
// pending only by a retry) whose error fits a NOTIFY with its event. A
// cancellation takes the general path, which also tells the holder
// (task_cancelled).
func (s *Service) hotEligible(status string, errMsg *string) bool {
	return s.db.Caps().HotPath && status != models.StatusClaimed && status != models.StatusPending &&
		status != models.StatusCancelled && (errMsg == nil || len(*errMsg) < hotErrorMax)
}

// toHotUpdate is a validated report by user in the one-statement path's form
// (the error is kept with a terminal status only, as the general path keeps
// it).
func toHotUpdate(user, id uuid.UUID, status string, errMsg *string, stored *string) models.HotUpdate {
	u := models.HotUpdate{ID: id, User: user, Status: status, Result: stored}
	if errMsg != nil && taskstatus.Terminal(status) {
		u.Error = *errMsg
	}
	return u
}

// hotTransitions are the transitions of a task held by a worker, as
// "from>to" for models.UpdateTasksHot.
var hotTransitions = func() []string {
	var out []string
	for _, from := range taskstatus.All {
		if from == models.StatusPending {
			continue // a pending task is never held by a worker
		}
		for _, to := range taskstatus.Next(from) {
			out = append(out, from+">"+to)
		}
	}
	slices.Sort(out)
	return out
}()

// updateTask is the general path of a status report: one transaction that
// tells every refusal apart.
func (s *Service) updateTask(ctx context.Context, p Principal, id uuid.UUID, status string, errMsg *string, stored *string, noRetry bool) (Task, error) {
	var out Task
	var lost *uuid.UUID
	retried := false
	err := s.mutate(ctx, func(q *models.Q, em *events.Set) error {
		lost, retried = nil, false
		t, err := q.GetTask(id)
		if err != nil {
			return notFound(err, errf(CodeTaskNotFound, "Task '%s' not found", id))
		}
		if err := lostToCaller(q, p, t, status, &lost); err != nil {
			return err
		}
		if err := s.authorizeUpdate(q, p, t, status); err != nil {
			return err
		}
		if !taskstatus.Allowed(t.Status, status) {
			return errf(CodeInvalidTaskTransition, "Cannot transition from '%s' to '%s'", t.Status, status)
		}
		if t.WorkerID == nil && (status == models.StatusClaimed || status == models.StatusRunning) {
			// Nothing would ever finish, fail or reap such a task: only a
			// worker's claim (POST /tasks/claim) makes a task claimed.
			return errf(CodeInvalidTaskTransition, "Cannot transition from '%s' to '%s': the task has no worker (workers claim tasks with POST /tasks/claim)", t.Status, status)
		}
		if p.Superuser {
			if err := auditOverride(q, p, t, status); err != nil {
				return err
			}
		}
		var ok bool
		if status == models.StatusFailed && t.RetryBackoff != nil && t.WorkerID != nil {
			// The job retries: this attempt's error is kept, and while
			// attempts are left the task waits out its backoff, pending.
			if err := q.RecordAttemptError(t, ptrOr(errMsg, "")); err != nil {
				return err
			}
			if !noRetry && t.MaxAttempts != nil && t.Attempt < *t.MaxAttempts {
				delay := retryDelay(*t.RetryBackoff, ptrOr(t.RetryMaxBackoff, DefaultRetryMaxBackoff), t.Attempt)
				if ok, err = q.RetryTaskLater(id, t.Status, errMsg, delay); err != nil {
					return err
				}
				retried = ok
			}
		}
		if !retried {
			if ok, err = q.TransitionTask(id, t.Status, status, nil, errMsg); err != nil {
				return err
			}
		}
		if !ok {
			// Past its deadline, or changed under us; report against the
			// state that won.
			if overdue, err := q.TaskOverdue(id); err != nil || overdue {
				if err != nil {
					return err
				}
				return errf(CodeInvalidTaskTransition, "Cannot transition from '%s' to '%s': the task is past its deadline (%s) and is being timed out",
					t.Status, status, t.DeadlineAt.UTC().Format(time.RFC3339))
			}
			cur, err := q.GetTask(id)
			if err != nil {
				return err
			}
			if err := lostToCaller(q, p, cur, status, &lost); err != nil {
				return err
			}
			return errf(CodeInvalidTaskTransition, "Cannot transition from '%s' to '%s'", cur.Status, status)
		}
		if stored != nil {
			if err := q.SetTaskResult(id, *stored); err != nil {
				return err
			}
		}
		// Only a task no worker holds (a pending one being cancelled) can
		// take a job's last reason to live: a held task's worker still links
		// the job, and a cleanup of that worker decides about the job. So
		// completions never lock the job row that all its tasks share.
		if taskstatus.Terminal(status) && t.WorkerID == nil {
			orphans, err := q.SoftDeleteOrphanJobs([]uuid.UUID{t.JobID})
			if err != nil {
				return err
			}
			for _, j := range orphans {
				em.Add(events.Room(j.RoomID), events.JobsInvalidate{})
			}
		}
		nt, err := q.GetTask(id)
		if err != nil {
			return err
		}
		out = taskView(nt)
		em.Add(events.Room(out.RoomID), statusEvent(out))
		if status == models.StatusCancelled && t.WorkerID != nil {
			em.Add(events.WorkerRoom(t.WorkerID.String()), events.TaskCancelled{TaskID: id.String(), Reason: "cancelled by " + p.Name})
		}
		return nil
	})
	if lost != nil {
		s.noteHeard(ctx, p.ID, *lost, HeardViaTaskUpdate)
	}
	if err == nil && retried {
		s.sched.kick() // its run_at may come before the armed timer
	}
	return out, err
}

// ptrOr is *p, or def when p is nil.
func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

// lostToCaller refuses a worker's late report about a task that a cleanup
// took from it: when the task was lost by a worker the caller owned, that a
// sweep, disconnect or startup recovery removed, and no other worker holds
// the task now, the answer is 404 worker-not-found (clients stop and
// re-register on it) and *lost is set so the false positive gets recorded.
func lostToCaller(q *models.Q, p Principal, t models.Task, status string, lost **uuid.UUID) error {
	if t.LostWorkerID == nil {
		return nil
	}
	switch status {
	case models.StatusRunning, models.StatusCompleted, models.StatusFailed:
	default:
		return nil
	}
	if t.WorkerID != nil && *t.WorkerID != *t.LostWorkerID {
		return nil // claimed again since; its holder's reports are judged as usual
	}
	_, reaped, err := q.ReapedWorker(*t.LostWorkerID, p.ID)
	if err != nil || !reaped {
		return err
	}
	id := *t.LostWorkerID
	*lost = &id
	return errf(CodeWorkerNotFound, "Worker '%s' not found", id)
}

// authorizeUpdate applies the contract's rules: superusers may update any
// task; otherwise the caller must own the worker holding the task. As a fix
// of the contract, the submitter may also cancel their own task while it is
// pending, claimed or running (its holder hears of it: task_cancelled).
func (s *Service) authorizeUpdate(q *models.Q, p Principal, t models.Task, status string) error {
	if p.Superuser {
		return nil
	}
	if status == models.StatusCancelled && t.CreatedByID != nil && *t.CreatedByID == p.ID {
		return nil
	}
	if t.WorkerID == nil {
		return errf(CodeForbidden, "Task not claimed by any worker")
	}
	w, err := q.GetWorker(*t.WorkerID)
	if err != nil || w.UserID != p.ID {
		if err != nil && !isNotFound(err) {
			return err
		}
		return errf(CodeForbidden, "Not authorized to update this task")
	}
	return nil
}

// auditOverride records a superuser's status change of a task that no
// worker of theirs holds (an admin action, not a worker's report).
func auditOverride(q *models.Q, p Principal, t models.Task, status string) error {
	if t.WorkerID != nil {
		w, err := q.GetWorker(*t.WorkerID)
		if err != nil && !isNotFound(err) {
			return err
		}
		if err == nil && w.UserID == p.ID {
			return nil
		}
	}
	return audit(q, AuditTaskStatus, &t.ID, "user:"+p.Name, map[string]any{
		"user_id": p.ID, "from": t.Status, "to": status, "worker_id": t.WorkerID, "job": t.JobFullName(),
	})
}

// TaskListParams filter a task listing.
type TaskListParams struct {
	Status string // optional; must be a valid status
	Page   PageParams
}

// ListRoomTasks pages through the tasks submitted to a room, newest first.
func (s *Service) ListRoomTasks(ctx context.Context, room string, lp TaskListParams) (Page[Task], error) {
	if err := ValidateRoomID(room); err != nil {
		return Page[Task]{}, err
	}
	return s.listTasks(s.db.Q(ctx), models.TaskFilter{RoomID: room, Status: lp.Status}, lp.Page)
}

// ListJobTasks pages through the tasks of one job submitted to a room.
func (s *Service) ListJobTasks(ctx context.Context, room, fullName string, lp TaskListParams) (Page[Task], error) {
	if err := ValidateRoomID(room); err != nil {
		return Page[Task]{}, err
	}
	q := s.db.Q(ctx)
	j, err := resolveJob(q, fullName)
	if err != nil {
		return Page[Task]{}, err
	}
	return s.listTasks(q, models.TaskFilter{RoomID: room, JobID: &j.ID, Status: lp.Status}, lp.Page)
}

func (s *Service) listTasks(q *models.Q, f models.TaskFilter, pg PageParams) (Page[Task], error) {
	ts, total, err := q.ListTasks(f, pg)
	if err != nil {
		return Page[Task]{}, err
	}
	items := make([]Task, len(ts))
	for i, t := range ts {
		items[i] = taskView(t)
	}
	return Page[Task]{Items: items, Total: total, Limit: pg.Limit, Offset: pg.Offset}, nil
}
