package joblib

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/clientaddr"
	"github.com/zndraw/joblib/models"
)

// Audit log actions (audit_log.action) of operator and admin actions.
const (
	// AuditTaskRetry: an operator put a failed task back to pending.
	AuditTaskRetry = "task_retry"
	// AuditTokenCreate: an operator issued an API token.
	AuditTokenCreate = "token_create"
	// AuditTokenRevoke: a token was revoked (by an operator, or at start-up
	// because JOBLIB_ADMIN_TOKEN changed).
	AuditTokenRevoke = "token_revoke"
	// AuditJobPolicy: a job's on_worker_loss/max_attempts changed.
	AuditJobPolicy = "job_policy_change"
	// AuditTaskStatus: a superuser changed the status of a task held by
	// another user's worker (or by none).
	AuditTaskStatus = "task_status_override"
	// AuditWorkerDelete: a superuser deleted another user's worker.
	AuditWorkerDelete = "worker_delete_override"
	// AuditProviderDelete: a superuser unregistered another user's provider.
	AuditProviderDelete = "provider_delete_override"
)

// audit writes one audit_log row with a JSON detail; an action a request
// made also records the client's address (detail.client_addr).
func audit(q *models.Q, action string, subject *uuid.UUID, actor string, detail map[string]any) error {
	if a := clientaddr.FromContext(q.Context()); a != "" {
		if detail == nil {
			detail = map[string]any{}
		}
		detail["client_addr"] = a
	}
	b, err := json.Marshal(detail)
	if err != nil {
		return fmt.Errorf("encode %s audit: %w", action, err)
	}
	return q.InsertAudit(action, subject, actor, string(b))
}

// AuditEntry is one audit_log row as `joblib audit list` shows it.
type AuditEntry struct {
	ID        uuid.UUID       `json:"id"`
	Action    string          `json:"action"`
	SubjectID *uuid.UUID      `json:"subject_id"`
	Actor     string          `json:"actor"`
	Detail    json.RawMessage `json:"detail"`
	CreatedAt time.Time       `json:"created_at"`
}

// ListAudit returns the newest audit_log rows first, optionally of one action.
func (s *Service) ListAudit(ctx context.Context, action string, limit int) ([]AuditEntry, error) {
	es, err := s.db.Q(ctx).ListAuditLog(action, limit)
	if err != nil {
		return nil, err
	}
	out := make([]AuditEntry, len(es))
	for i, e := range es {
		d := json.RawMessage(e.Detail)
		if !json.Valid(d) {
			d, _ = json.Marshal(e.Detail)
		}
		out[i] = AuditEntry{ID: e.ID, Action: e.Action, SubjectID: e.SubjectID, Actor: e.Actor, Detail: d, CreatedAt: e.CreatedAt.UTC()}
	}
	return out, nil
}

// RetryTask puts a failed task back to pending (joblib tasks retry), keeps
// its attempt count, writes an audit_log row naming the actor and publishes
// the task's status event and task_available. The task's job must be live:
// a soft-deleted job has no worker to claim it (re-register it first).
func (s *Service) RetryTask(ctx context.Context, id uuid.UUID, actor string) (Task, error) {
	var out Task
	err := s.mutate(ctx, func(q *models.Q, em *events.Set) error {
		t, err := q.GetTask(id)
		if err != nil {
			return notFound(err, errf(CodeTaskNotFound, "Task '%s' not found", id))
		}
		if t.Status != models.StatusFailed {
			return errf(CodeInvalidTaskTransition, "Cannot retry a task in status '%s': only failed tasks are retried", t.Status)
		}
		if t.JobRoom == nil || t.JobCategory == nil || t.JobName == nil {
			return errf(CodeJobNotFound, "Job of task '%s' not found", id)
		}
		j, err := q.JobByKey(*t.JobRoom, *t.JobCategory, *t.JobName)
		if err != nil {
			return notFound(err, errf(CodeJobNotFound, "Job '%s' not found", t.JobFullName()))
		}
		if j.Deleted {
			return errf(CodeJobNotFound, "Job '%s' is deleted (no worker serves it); re-register it before retrying", j.FullName())
		}
		if j.RoomID == RoomInternal {
			return errf(CodeInvalidTaskTransition, "Internal tasks are not retried: submit a new one")
		}
		ok, err := q.RetryTask(id)
		if err != nil {
			return err
		}
		if !ok {
			return errf(CodeInvalidTaskTransition, "Task '%s' changed while retrying", id)
		}
		detail, err := json.Marshal(map[string]any{"from": t.Status, "error": t.Error, "attempt": t.Attempt, "lost_worker_id": t.LostWorkerID})
		if err != nil {
			return fmt.Errorf("encode retry audit: %w", err)
		}
		if err := q.InsertAudit(AuditTaskRetry, &id, actor, string(detail)); err != nil {
			return err
		}
		nt, err := q.GetTask(id)
		if err != nil {
			return err
		}
		out = taskView(nt)
		em.Add(events.Room(out.RoomID), statusEvent(out))
		em.Add(events.JobRoom(out.JobName), events.TaskAvailable{JobName: out.JobName, RoomID: out.RoomID, TaskID: out.ID.String()})
		return nil
	})
	return out, err
}

// AuditActions lists every audit_log action, for `joblib audit list --action`.
var AuditActions = []string{AuditTaskRetry, AuditTaskCancel, AuditWorkerOperatorDelete, AuditTokenCreate, AuditTokenRevoke,
	AuditJobPolicy, AuditTaskStatus, AuditWorkerDelete, AuditProviderDelete}

// CheckSweepThreshold refuses an operator sweep threshold below twice the
// socket keep-alive interval: a node refreshes the heartbeats of its
// socket-bound workers only that often, so such a sweep would reap live
// workers. keepAlive 0 (no sockets) checks nothing.
func CheckSweepThreshold(threshold, keepAlive time.Duration) error {
	if keepAlive > 0 && threshold < 2*keepAlive {
		return errf(CodeValidation, "threshold %s is below twice the socket keep-alive interval (%s): the servers refresh the heartbeats of socket-bound workers only every %s, so live workers would be swept; use at least %s",
			threshold, keepAlive, keepAlive, 2*keepAlive)
	}
	return nil
}

// OperatorUserPrefix starts the names of the superusers the CLI acts as when
// it sends an operator command to a running server ("cli:" + the operator's
// name): the server records their actions under that name.
const OperatorUserPrefix = "cli:"

// operatorTokenName marks the short-lived tokens of IssueOperatorToken.
const operatorTokenName = "operator-command"

// IssueOperatorToken issues a token that expires after ttl for the superuser
// OperatorUserPrefix+operator (created if new), with which the CLI sends one
// operator command to a running server. Whoever can write the database can
// already do everything a superuser can; the token is not audited (the
// action it carries is) and RevokeOperatorToken ends it after use.
func (s *Service) IssueOperatorToken(ctx context.Context, operator string, ttl time.Duration) (string, uuid.UUID, error) {
	token := newToken()
	var id uuid.UUID
	err := s.db.Tx(ctx, func(q *models.Q) error {
		name := OperatorUserPrefix + operator
		u, err := q.UserByName(name)
		switch {
		case errors.Is(err, models.ErrNotFound):
			u, err = q.CreateUser(name, true)
		case err == nil && !u.IsSuperuser:
			err = q.SetSuperuser(u.ID, true)
		}
		if err != nil {
			return err
		}
		now, err := q.DBNow()
		if err != nil {
			return err
		}
		id, err = q.CreateAPIToken(u.ID, operatorTokenName, HashToken(token), models.Time{Time: now.Add(ttl)})
		return err
	})
	if err != nil {
		return "", uuid.Nil, fmt.Errorf("issue operator token: %w", err)
	}
	return token, id, nil
}

// RevokeOperatorToken ends a token of IssueOperatorToken.
func (s *Service) RevokeOperatorToken(ctx context.Context, id uuid.UUID) error {
	_, err := s.db.Q(ctx).RevokeAPITokens([]uuid.UUID{id})
	return err
}

// UserNames returns the names of the users with these ids ("-" for one that
// no longer exists).
func (s *Service) UserNames(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID]string, error) {
	q := s.db.Q(ctx)
	out := make(map[uuid.UUID]string, len(ids))
	for _, id := range ids {
		if _, ok := out[id]; ok {
			continue
		}
		u, err := q.UserByID(id)
		switch {
		case err == nil:
			out[id] = u.Name
		case errors.Is(err, models.ErrNotFound):
			out[id] = "-"
		default:
			return nil, err
		}
	}
	return out, nil
}
