package joblib

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/canonical"
	"github.com/zndraw/joblib/internal/limits"
	"github.com/zndraw/joblib/models"
)

// MaxIdempotencyKeyLen is the longest Idempotency-Key accepted, in characters.
const MaxIdempotencyKeyLen = 255

// Submission is one submit request: one task, or a batch of tasks of one
// job (Batch), optionally under an Idempotency-Key.
type Submission struct {
	Room, FullName string
	// Payloads holds one payload per task; a single submission has one.
	Payloads []json.RawMessage
	// Timeouts, when not nil, holds each task's own task_timeout in
	// seconds (nil entries: the job's), one per payload.
	Timeouts []*int
	// Scheds, when not nil, holds each task's priority and the time it
	// may run from, one per payload.
	Scheds []models.TaskSched
	Batch  bool
	// IdempotencyKey, when not empty, makes a repeat of this request by
	// the same user within Settings.IdempotencyWindow answer what the
	// first one got, creating nothing.
	IdempotencyKey string
}

// Submitted is the answer to a Submission.
type Submitted struct {
	// Tasks are the tasks created (or, replayed, those the first request
	// created as it answered them), in the order of the payloads.
	Tasks []Task
	// Body is the JSON answer: the task, or {"tasks": [...]} for a batch.
	// A replay answers the first request's body byte for byte.
	Body []byte
	// Replayed is true when the answer is a stored one (Idempotent-Replayed).
	Replayed bool
}

// BatchAnswer is the body of a batch submission's answer.
type BatchAnswer struct {
	Tasks []Task `json:"tasks"`
}

// ValidateIdempotencyKey checks an Idempotency-Key: 1 to 255 printable
// characters of valid UTF-8.
func ValidateIdempotencyKey(k string) error {
	if k == "" || !utf8.ValidString(k) || utf8.RuneCountInString(k) > MaxIdempotencyKeyLen {
		return errf(CodeValidation, "Idempotency-Key must be 1 to %d printable characters", MaxIdempotencyKeyLen)
	}
	for _, r := range k {
		if !unicode.IsPrint(r) {
			return errf(CodeValidation, "Idempotency-Key must be 1 to %d printable characters", MaxIdempotencyKeyLen)
		}
	}
	return nil
}

// Submit creates the tasks of sub. A single submission without a key takes
// SubmitTask's path. A batch creates all its tasks in one transaction and
// one insert statement, or none (over the pending-task quota it is refused
// whole); it counts as one request against the submit rate. With a key the
// (user, key) row is claimed first in the same transaction: two concurrent
// requests with one key, on any node, create one set of tasks, and the
// other answers the stored body with Replayed set. A repeat whose request
// (room, job, payloads, single or batch) differs answers 422
// idempotency-key-reused.
func (s *Service) Submit(ctx context.Context, p Principal, sub Submission) (Submitted, error) {
	if !sub.Batch && len(sub.Payloads) != 1 {
		return Submitted{}, errf(CodeValidation, "a single submission has one payload")
	}
	if sub.Timeouts == nil {
		sub.Timeouts = make([]*int, len(sub.Payloads))
	}
	if sub.Scheds == nil {
		sub.Scheds = make([]models.TaskSched, len(sub.Payloads))
	}
	if len(sub.Timeouts) != len(sub.Payloads) || len(sub.Scheds) != len(sub.Payloads) {
		return Submitted{}, errf(CodeValidation, "one timeout and one schedule per task")
	}
	if sub.IdempotencyKey == "" && !sub.Batch {
		t, err := s.SubmitTaskWith(ctx, p, sub.Room, sub.FullName, sub.Payloads[0], SubmitOptions{Timeout: sub.Timeouts[0], Sched: sub.Scheds[0]})
		if err != nil {
			return Submitted{}, err
		}
		body, err := json.Marshal(t)
		return Submitted{Tasks: []Task{t}, Body: body}, err
	}
	if err := ValidateRoomID(sub.Room); err != nil {
		return Submitted{}, err
	}
	if sub.IdempotencyKey != "" {
		if err := ValidateIdempotencyKey(sub.IdempotencyKey); err != nil {
			return Submitted{}, err
		}
	}
	st := s.Settings()
	if sub.Batch && (len(sub.Payloads) == 0 || len(sub.Payloads) > st.MaxSubmitBatch) {
		return Submitted{}, errf(CodeValidation, `field "tasks": a batch holds 1 to %d tasks (JOBLIB_MAX_SUBMIT_BATCH), got %d`, st.MaxSubmitBatch, len(sub.Payloads))
	}
	for i, to := range sub.Timeouts {
		field := "timeout"
		if sub.Batch {
			field = "tasks[" + strconv.Itoa(i) + "].timeout"
		}
		if err := checkTimeout(field, to); err != nil {
			return Submitted{}, err
		}
		prefix := ""
		if sub.Batch {
			prefix = "tasks[" + strconv.Itoa(i) + "]."
		}
		if err := checkSched(prefix, sub.Scheds[i]); err != nil {
			return Submitted{}, err
		}
	}
	bodies := make([]string, len(sub.Payloads))
	for i, raw := range sub.Payloads {
		b, err := canonicalObject(raw)
		if err != nil {
			if e, ok := AsError(err); ok {
				e.Detail = "payload must be a JSON object"
				if sub.Batch {
					e.Detail = "tasks[" + strconv.Itoa(i) + "].payload must be a JSON object"
				}
			}
			return Submitted{}, err
		}
		bodies[i] = b
	}
	hash := ""
	if sub.IdempotencyKey != "" {
		var err error
		if hash, err = submissionHash(sub, bodies); err != nil {
			return Submitted{}, err
		}
	}
	if err := allow(s.rates.submit, p, limits.SubmitRate, "task submissions"); err != nil {
		return Submitted{}, err
	}
	if strings.HasPrefix(sub.FullName, RoomInternal+":") {
		if err := allow(s.rates.internal, p, limits.InternalRate, "@internal task submissions"); err != nil {
			return Submitted{}, err
		}
	}
	out, err := s.submitTx(ctx, p, sub, bodies, hash)
	if errors.Is(err, models.ErrIdempotencyKeyGone) {
		// The key expired and was deleted between our two statements
		// (retention): once more claims it afresh.
		out, err = s.submitTx(ctx, p, sub, bodies, hash)
	}
	return out, err
}

// submitTx is Submit's transaction and what follows its commit.
func (s *Service) submitTx(ctx context.Context, p Principal, sub Submission, bodies []string, hash string) (Submitted, error) {
	st := s.Settings()
	var (
		state submitState
		out   Submitted
	)
	err := s.mutate(ctx, func(q *models.Q, em *events.Set) error {
		out = Submitted{}
		if sub.IdempotencyKey != "" {
			prev, fresh, err := q.ClaimIdempotencyKey(p.ID, sub.IdempotencyKey, hash, st.IdempotencyWindow)
			if err != nil {
				return err
			}
			if !fresh {
				if prev.RequestHash != hash {
					return errf(CodeIdempotencyKeyReused, "Idempotency-Key %q was used for a different request within the last %s; use a new key for a new request", sub.IdempotencyKey, st.IdempotencyWindow)
				}
				out = Submitted{Body: []byte(prev.Response), Replayed: true}
				return nil
			}
		}
		tasks, err := s.insertSubmission(q, em, p, sub.Room, sub.FullName, bodies, sub.Timeouts, sub.Scheds, &state)
		if err != nil {
			return err
		}
		var body []byte
		if sub.Batch {
			body, err = json.Marshal(BatchAnswer{Tasks: tasks})
		} else {
			body, err = json.Marshal(tasks[0])
		}
		if err != nil {
			return err
		}
		out = Submitted{Tasks: tasks, Body: body}
		if sub.IdempotencyKey != "" {
			return q.SetIdempotencyResponse(p.ID, sub.IdempotencyKey, string(body))
		}
		return nil
	})
	if out.Replayed {
		if err != nil {
			return Submitted{}, err
		}
		return out, replayTasks(&out, sub.Batch)
	}
	if _, err := s.afterSubmission(ctx, p, out.Tasks, &state, err); err != nil {
		return Submitted{}, err
	}
	return out, nil
}

// replayTasks fills out.Tasks from a stored answer.
func replayTasks(out *Submitted, batch bool) error {
	if batch {
		var a BatchAnswer
		if err := json.Unmarshal(out.Body, &a); err != nil {
			return err
		}
		out.Tasks = a.Tasks
		return nil
	}
	var t Task
	if err := json.Unmarshal(out.Body, &t); err != nil {
		return err
	}
	out.Tasks = []Task{t}
	return nil
}

// submissionHash identifies a request for its idempotency key: the room,
// the job, single or batch, and each payload by its canonical JSON (sorted
// keys), so that a repeat that only reorders members is the same request.
func submissionHash(sub Submission, bodies []string) (string, error) {
	ps := make([]any, len(bodies))
	ts := make([]any, len(bodies))
	for i, to := range sub.Timeouts {
		if to != nil {
			ts[i] = *to
		}
	}
	for i, b := range bodies {
		d := json.NewDecoder(bytes.NewReader([]byte(b)))
		d.UseNumber()
		if err := d.Decode(&ps[i]); err != nil {
			return "", errf(CodeValidation, "payload: %v", err)
		}
	}
	req := map[string]any{"room": sub.Room, "job": sub.FullName, "batch": sub.Batch, "payloads": ps, "timeouts": ts}
	for _, sc := range sub.Scheds {
		if sc != (models.TaskSched{}) {
			// Only when set: the hash of a request without them is the
			// one keys stored before these fields existed.
			scheds := make([]any, len(sub.Scheds))
			for i, sc := range sub.Scheds {
				m := map[string]any{"priority": sc.Priority}
				if sc.RunAt != nil {
					m["run_at"] = sc.RunAt.UTC().Format(time.RFC3339Nano)
				}
				if sc.Delay != nil {
					m["delay"] = *sc.Delay
				}
				scheds[i] = m
			}
			req["scheds"] = scheds
			break
		}
	}
	h, err := canonical.RequestHashOf(req)
	if err != nil {
		return "", errf(CodeValidation, "payload: %v", err)
	}
	return h, nil
}
