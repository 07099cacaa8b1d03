package joblib

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/models"
)

// Worker-loss policies of a job: what CleanupWorker does with the claimed and
// running tasks of a worker that is gone.
const (
	// OnWorkerLossFail fails them with "Worker disconnected" (the default).
	OnWorkerLossFail = "fail"
	// OnWorkerLossRequeue puts them back to pending until MaxAttempts claims
	// were used, then fails them.
	OnWorkerLossRequeue = "requeue"
)

// DefaultRequeueAttempts is max_attempts for a requeue policy that names none.
const DefaultRequeueAttempts = 3

// RegisterJobParams is the body of PUT /rooms/{room}/jobs.
type RegisterJobParams struct {
	Category string
	Name     string
	Schema   json.RawMessage // nil means {}
	WorkerID *uuid.UUID      // nil: a new worker is created for the caller
	// OnWorkerLoss is "fail" or "requeue"; empty keeps a live job's policy
	// (new jobs get "fail").
	OnWorkerLoss string
	// MaxAttempts bounds claims under the requeue policy (0: default).
	MaxAttempts int
	// TaskTimeout and HeartbeatTimeout are the job's task limits in
	// seconds (positive; nil keeps a live job's, new jobs get none): a task
	// is stuck TaskTimeout after its claim, or HeartbeatTimeout after the
	// later of its claim and its last progress report.
	TaskTimeout      *int
	HeartbeatTimeout *int
	// OnTimeout is what a stuck task becomes: "fail" or "requeue" (while
	// MaxAttempts allows); empty keeps a live job's (new jobs: "fail").
	OnTimeout string
	// Retry, when not nil, makes a worker's failed report put the task
	// back to pending after a backoff (see RetryPolicy); nil keeps a live
	// job's (new jobs: a failed report is final).
	Retry *RetryPolicy
}

// RetryPolicy is a job's retry: a worker's failed report of attempt n puts
// the task back to pending, claimable from now + min(MaxBackoff, Backoff ×
// 2^(n-1)) seconds (plus up to 10 % jitter) on the database clock, while n
// < MaxAttempts. MaxAttempts is the job's max_attempts, which worker losses
// and timeouts requeued by on_worker_loss / on_timeout count against too.
type RetryPolicy struct {
	MaxAttempts int      `json:"max_attempts"`
	Backoff     float64  `json:"backoff"`
	MaxBackoff  *float64 `json:"max_backoff"`
}

// Retry defaults and bounds.
const (
	// DefaultRetryMaxBackoff is max_backoff when a policy names none (1h).
	DefaultRetryMaxBackoff = 3600.0
	// maxRetrySeconds bounds backoff and max_backoff (a day).
	maxRetrySeconds = 86400.0
)

// checkRetry validates a retry policy and returns it complete.
func checkRetry(r *RetryPolicy, maxAttempts int) (*RetryPolicy, error) {
	if r == nil {
		return nil, nil
	}
	out := *r
	if out.MaxAttempts == 0 {
		out.MaxAttempts = cmp.Or(maxAttempts, DefaultRequeueAttempts)
	}
	if out.MaxAttempts < 1 || out.MaxAttempts > MaxAttemptsLimit {
		return nil, errf(CodeValidation, "retry.max_attempts must be between 1 and %d", MaxAttemptsLimit)
	}
	if maxAttempts != 0 && maxAttempts != out.MaxAttempts {
		return nil, errf(CodeValidation, "max_attempts (%d) and retry.max_attempts (%d) differ; they are one limit, give one", maxAttempts, out.MaxAttempts)
	}
	if !(out.Backoff >= 0 && out.Backoff <= maxRetrySeconds) {
		return nil, errf(CodeValidation, "retry.backoff must be between 0 and %.0f seconds", maxRetrySeconds)
	}
	mb := max(DefaultRetryMaxBackoff, out.Backoff)
	if out.MaxBackoff != nil {
		mb = *out.MaxBackoff
	}
	if !(mb >= out.Backoff && mb <= maxRetrySeconds) {
		return nil, errf(CodeValidation, "retry.max_backoff must be between retry.backoff and %.0f seconds", maxRetrySeconds)
	}
	out.MaxBackoff = &mb
	return &out, nil
}

// retryView is a job's retry policy as the API shows it (nil: none).
func retryView(j models.Job) *RetryPolicy {
	if j.RetryBackoff == nil {
		return nil
	}
	r := &RetryPolicy{MaxAttempts: j.MaxAttempts, Backoff: *j.RetryBackoff, MaxBackoff: j.RetryMaxBackoff}
	return r
}

// retryChanges reports whether a registration's retry policy differs from
// the job's.
func retryChanges(j models.Job, r *RetryPolicy) bool {
	if r == nil {
		return false
	}
	cur := retryView(j)
	return cur == nil || cur.MaxAttempts != r.MaxAttempts || cur.Backoff != r.Backoff || *cur.MaxBackoff != *r.MaxBackoff
}

// Timeout policies of a job: what the sweeper does with a task past its
// deadline.
const (
	// OnTimeoutFail fails it with an error naming the limit (the default).
	OnTimeoutFail = "fail"
	// OnTimeoutRequeue puts it back to pending while the job's
	// max_attempts allows, then fails it.
	OnTimeoutRequeue = "requeue"
)

// MaxTimeoutSeconds is the largest task limit a job or a submission may set
// (a year).
const MaxTimeoutSeconds = 365 * 24 * 3600

// checkTimeout validates a limit in seconds (nil: none given).
func checkTimeout(field string, v *int) error {
	if v != nil && (*v < 1 || *v > MaxTimeoutSeconds) {
		return errf(CodeValidation, "%s must be a whole number of seconds between 1 and %d", field, MaxTimeoutSeconds)
	}
	return nil
}

// timeoutPolicy validates the limits and policy of a registration.
func timeoutPolicy(r RegisterJobParams) error {
	if err := checkTimeout("task_timeout", r.TaskTimeout); err != nil {
		return err
	}
	if err := checkTimeout("heartbeat_timeout", r.HeartbeatTimeout); err != nil {
		return err
	}
	switch r.OnTimeout {
	case "", OnTimeoutFail, OnTimeoutRequeue:
		return nil
	}
	return errf(CodeValidation, "on_timeout must be 'fail' or 'requeue', got '%s'", r.OnTimeout)
}

// timeoutsChange applies the limits a registration names to a live job's
// and reports whether they differ.
func timeoutsChange(j *models.Job, r RegisterJobParams) bool {
	changed := false
	if r.TaskTimeout != nil && (j.TaskTimeout == nil || *j.TaskTimeout != *r.TaskTimeout) {
		j.TaskTimeout, changed = r.TaskTimeout, true
	}
	if r.HeartbeatTimeout != nil && (j.HeartbeatTimeout == nil || *j.HeartbeatTimeout != *r.HeartbeatTimeout) {
		j.HeartbeatTimeout, changed = r.HeartbeatTimeout, true
	}
	if r.OnTimeout != "" && r.OnTimeout != cmp.Or(j.OnTimeout, OnTimeoutFail) {
		j.OnTimeout, changed = r.OnTimeout, true
	}
	return changed
}

// RegisterJob registers (or re-registers) a job in a room and links a worker
// to it. created is true when the job row was inserted or reactivated.
func (s *Service) RegisterJob(ctx context.Context, p Principal, room string, r RegisterJobParams) (job Job, created bool, err error) {
	if err := ValidateRoomID(room); err != nil {
		return Job{}, false, err
	}
	if (room == RoomGlobal || room == RoomInternal) && !p.Superuser {
		return Job{}, false, errf(CodeForbidden, "Admin required for @global/@internal job registration")
	}
	if err := validateText("category", r.Category, maxCategoryLen); err != nil {
		return Job{}, false, err
	}
	if err := validateText("name", r.Name, maxNameLen); err != nil {
		return Job{}, false, err
	}
	if err := validateAddressable("job", room, r.Category, r.Name, "tasks"); err != nil {
		return Job{}, false, err
	}
	st := s.Settings()
	if !st.AllowedCategories.Contains(r.Category) {
		return Job{}, false, errf(CodeInvalidCategory, "Category '%s' not in allowed list: %s", r.Category, st.AllowedCategories.pyList())
	}
	retry, err := checkRetry(r.Retry, r.MaxAttempts)
	if err != nil {
		return Job{}, false, err
	}
	if retry != nil {
		r.MaxAttempts = retry.MaxAttempts
	}
	policy, attempts, err := jobPolicy(r.OnWorkerLoss, r.MaxAttempts)
	if err != nil {
		return Job{}, false, err
	}
	if err := timeoutPolicy(r); err != nil {
		return Job{}, false, err
	}
	schema, err := canonicalObject(r.Schema)
	if err != nil {
		return Job{}, false, err
	}

	err = s.mutate(ctx, func(q *models.Q, em *events.Set) error {
		// The worker first (lock order worker → job, as in CleanupWorker);
		// its error is reported after the job's, in the contract's order.
		if r.WorkerID == nil {
			if err := s.checkQuota(q, p, models.UsageWorkers, false); err != nil {
				return err
			}
		}
		w, werr := workerFor(q, p, r.WorkerID)
		if werr != nil && !IsCode(werr, CodeWorkerNotFound) {
			return werr
		}
		creator := p.ID
		row := models.Job{ID: uuid.New(), RoomID: room, Category: r.Category, Name: r.Name, Schema: schema,
			OnWorkerLoss: policy, MaxAttempts: attempts, CreatedByID: &creator,
			TaskTimeout: r.TaskTimeout, HeartbeatTimeout: r.HeartbeatTimeout, OnTimeout: cmp.Or(r.OnTimeout, OnTimeoutFail)}
		if retry != nil {
			row.RetryBackoff, row.RetryMaxBackoff = &retry.Backoff, retry.MaxBackoff
		}
		inserted, err := q.InsertJobIfAbsent(row)
		if err != nil {
			return err
		}
		// Locked so that a concurrent orphan soft-delete either finished
		// before (we see the job deleted and reactivate it) or waits for our
		// link and then keeps the job.
		j, err := q.JobByKeyLocked(room, r.Category, r.Name, models.NoKeyUpdate)
		if err != nil {
			return err
		}
		switch {
		case inserted:
			created = true
		case j.Deleted:
			if created, err = q.ReactivateJob(j.ID, schema, row, &creator); err != nil {
				return err
			}
			j.Schema, j.Deleted, j.OnWorkerLoss, j.MaxAttempts, j.CreatedByID = schema, false, policy, attempts, &creator
			j.TaskTimeout, j.HeartbeatTimeout, j.OnTimeout = row.TaskTimeout, row.HeartbeatTimeout, row.OnTimeout
			j.RetryBackoff, j.RetryMaxBackoff = row.RetryBackoff, row.RetryMaxBackoff
		default:
			same, err := sameJSON(j.Schema, schema)
			if err != nil {
				return err
			}
			if !same {
				return errf(CodeSchemaConflict, "Schema mismatch for job '%s'", j.FullName())
			}
			if r.OnWorkerLoss != "" && (policy != j.OnWorkerLoss || attempts != j.MaxAttempts) {
				// The policy is its creator's (or a superuser's) to change;
				// anyone else linking a worker must agree with it.
				if !mayChangePolicies(p, j) {
					return errf(CodePolicyConflict, "Worker-loss policy mismatch for job '%s': it is on_worker_loss '%s' with max_attempts %d, set by the job's creator",
						j.FullName(), j.OnWorkerLoss, j.MaxAttempts)
				}
				if err := q.SetJobPolicy(j.ID, policy, attempts); err != nil {
					return err
				}
				if err := audit(q, AuditJobPolicy, &j.ID, "user:"+p.Name, map[string]any{
					"job": j.FullName(), "user_id": p.ID, "superuser": p.Superuser,
					"from": map[string]any{"on_worker_loss": j.OnWorkerLoss, "max_attempts": j.MaxAttempts},
					"to":   map[string]any{"on_worker_loss": policy, "max_attempts": attempts},
				}); err != nil {
					return err
				}
				j.OnWorkerLoss, j.MaxAttempts = policy, attempts
			}
			if retryChanges(j, retry) {
				// The retry policy is the creator's too; it sets max_attempts.
				if !mayChangePolicies(p, j) {
					return errf(CodePolicyConflict, "Retry policy mismatch for job '%s': set by the job's creator", j.FullName())
				}
				if err := q.SetJobRetry(j.ID, &retry.Backoff, retry.MaxBackoff, retry.MaxAttempts); err != nil {
					return err
				}
				if err := audit(q, AuditJobPolicy, &j.ID, "user:"+p.Name, map[string]any{
					"job": j.FullName(), "user_id": p.ID, "superuser": p.Superuser,
					"from": map[string]any{"retry": retryView(j)}, "to": map[string]any{"retry": retry},
				}); err != nil {
					return err
				}
				j.RetryBackoff, j.RetryMaxBackoff, j.MaxAttempts = &retry.Backoff, retry.MaxBackoff, retry.MaxAttempts
			}
			before := j
			if timeoutsChange(&j, r) {
				// The limits are the creator's too, as the worker-loss policy.
				if !mayChangePolicies(p, j) {
					return errf(CodePolicyConflict, "Timeout policy mismatch for job '%s': it is task_timeout %s, heartbeat_timeout %s, on_timeout '%s', set by the job's creator",
						j.FullName(), secondsText(before.TaskTimeout), secondsText(before.HeartbeatTimeout), cmp.Or(before.OnTimeout, OnTimeoutFail))
				}
				if err := q.SetJobTimeouts(j.ID, j.TaskTimeout, j.HeartbeatTimeout, j.OnTimeout); err != nil {
					return err
				}
				if err := audit(q, AuditJobPolicy, &j.ID, "user:"+p.Name, map[string]any{
					"job": j.FullName(), "user_id": p.ID, "superuser": p.Superuser,
					"from": map[string]any{"task_timeout": before.TaskTimeout, "heartbeat_timeout": before.HeartbeatTimeout, "on_timeout": before.OnTimeout},
					"to":   map[string]any{"task_timeout": j.TaskTimeout, "heartbeat_timeout": j.HeartbeatTimeout, "on_timeout": j.OnTimeout},
				}); err != nil {
					return err
				}
			}
		}
		if werr != nil {
			return werr
		}
		if err := q.LinkWorkerJob(w.ID, j.ID); err != nil {
			if errors.Is(err, models.ErrConflict) {
				// The worker was cleaned up between our read and the link.
				return errf(CodeWorkerNotFound, "Worker '%s' not found or not owned by user", w.ID)
			}
			return err
		}
		links, err := q.JobWorkerIDs([]uuid.UUID{j.ID})
		if err != nil {
			return err
		}
		job = jobView(j, links[j.ID], &w.ID)
		em.Add(events.Room(room), events.JobsInvalidate{})
		return nil
	})
	return job, created, err
}

// MaxAttemptsLimit is the largest max_attempts a job may set (the column
// is a 32-bit integer; no policy needs more).
const MaxAttemptsLimit = 1000

func jobPolicy(onLoss string, attempts int) (string, int, error) {
	if attempts > MaxAttemptsLimit {
		return "", 0, errf(CodeValidation, "max_attempts must be at most %d", MaxAttemptsLimit)
	}
	switch onLoss {
	case "", OnWorkerLossFail:
		if attempts < 0 {
			return "", 0, errf(CodeValidation, "max_attempts must be at least 1")
		}
		return OnWorkerLossFail, max(attempts, 1), nil
	case OnWorkerLossRequeue:
		if attempts == 0 {
			attempts = DefaultRequeueAttempts
		}
		if attempts < 1 {
			return "", 0, errf(CodeValidation, "max_attempts must be at least 1")
		}
		return OnWorkerLossRequeue, attempts, nil
	}
	return "", 0, errf(CodeValidation, "on_worker_loss must be 'fail' or 'requeue', got '%s'", onLoss)
}

// resolveJob finds a live job by full name (visibility is not checked: any
// room may address any job, as the contract requires).
func resolveJob(q *models.Q, fullName string) (models.Job, error) {
	return resolveJobLocked(q, fullName, models.NoLock)
}

// resolveJobLocked is resolveJob inside a transaction that depends on the job
// staying live until it commits (see models.RowLock).
func resolveJobLocked(q *models.Q, fullName string, l models.RowLock) (models.Job, error) {
	room, cat, name, ok := SplitFullName(fullName)
	if !ok {
		return models.Job{}, errf(CodeJobNotFound, "Invalid job name format: %s", fullName)
	}
	if !addressable(room, cat, name) {
		return models.Job{}, errf(CodeJobNotFound, "Job '%s' not found", fullName)
	}
	j, err := q.JobByKeyLocked(room, cat, name, l)
	if err == nil && j.Deleted {
		err = models.ErrNotFound
	}
	if err != nil {
		return j, notFound(err, errf(CodeJobNotFound, "Job '%s' not found", fullName))
	}
	return j, nil
}

// GetJob returns a live job by full name.
func (s *Service) GetJob(ctx context.Context, room, fullName string) (Job, error) {
	if err := ValidateRoomID(room); err != nil {
		return Job{}, err
	}
	q := s.db.Q(ctx)
	j, err := resolveJob(q, fullName)
	if err != nil {
		return Job{}, err
	}
	links, err := q.JobWorkerIDs([]uuid.UUID{j.ID})
	if err != nil {
		return Job{}, err
	}
	return jobView(j, links[j.ID], nil), nil
}

// ListJobs pages through the live jobs visible from a room, newest first.
func (s *Service) ListJobs(ctx context.Context, room string, pg PageParams) (Page[JobSummary], error) {
	if err := ValidateRoomID(room); err != nil {
		return Page[JobSummary]{}, err
	}
	q := s.db.Q(ctx)
	js, total, err := q.ListJobs(jobRoomsVisibleFrom(room), pg)
	if err != nil {
		return Page[JobSummary]{}, err
	}
	ids := make([]uuid.UUID, len(js))
	for i, j := range js {
		ids[i] = j.ID
	}
	links, err := q.JobWorkerIDs(ids)
	if err != nil {
		return Page[JobSummary]{}, err
	}
	items := make([]JobSummary, len(js))
	for i, j := range js {
		ws := links[j.ID]
		if ws == nil {
			ws = []uuid.UUID{}
		}
		items[i] = JobSummary{FullName: j.FullName(), Category: j.Category, Name: j.Name, Workers: ws}
	}
	return Page[JobSummary]{Items: items, Total: total, Limit: pg.Limit, Offset: pg.Offset}, nil
}

// canonicalObject checks that raw is a JSON object (nil means {}) and returns
// it compacted.
func canonicalObject(raw json.RawMessage) (string, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return "{}", nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", errf(CodeValidation, "schema: %v", err)
	}
	if _, ok := v.(map[string]any); !ok {
		return "", errf(CodeValidation, "schema must be a JSON object")
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return "", errf(CodeValidation, "schema: %v", err)
	}
	return b.String(), nil
}

// sameJSON compares two JSON documents the way the Python server did: deep
// equality where numbers compare by value and true/false equal 1/0.
func sameJSON(a, b string) (bool, error) {
	var va, vb any
	if err := json.Unmarshal([]byte(a), &va); err != nil {
		return false, err
	}
	if err := json.Unmarshal([]byte(b), &vb); err != nil {
		return false, err
	}
	return pyEqual(va, vb), nil
}

func pyEqual(a, b any) bool {
	if x, ok := pyNumber(a); ok {
		y, ok := pyNumber(b)
		return ok && x == y
	}
	switch av := a.(type) {
	case nil:
		return b == nil
	case string:
		bv, ok := b.(string)
		return ok && av == bv
	case []any:
		bv, ok := b.([]any)
		if !ok || len(av) != len(bv) {
			return false
		}
		for i := range av {
			if !pyEqual(av[i], bv[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok || len(av) != len(bv) {
			return false
		}
		for k, x := range av {
			y, ok := bv[k]
			if !ok || !pyEqual(x, y) {
				return false
			}
		}
		return true
	}
	return false
}

func pyNumber(v any) (float64, bool) {
	switch n := v.(type) {
	case float64:
		return n, true
	case bool:
		if n {
			return 1, true
		}
		return 0, true
	}
	return 0, false
}

// secondsText names a limit in seconds for a message ("none" when unset).
func secondsText(v *int) string {
	if v == nil {
		return "none"
	}
	return strconv.Itoa(*v) + "s"
}

// mayChangePolicies: a job's policies (worker loss, timeouts) are its
// creator's, or a superuser's, to change; anyone else linking a worker must
// agree with them.
func mayChangePolicies(p Principal, j models.Job) bool {
	return p.Superuser || (j.CreatedByID != nil && *j.CreatedByID == p.ID)
}
