package models

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
)

// MaxTaskBatch is the most tasks one InsertTasks call inserts (one
// statement: its bound parameters stay below both databases' limits).
const MaxTaskBatch = 1000

// InsertTasks creates one task per payload for a job, all with one status,
// in one statement, and returns them as the API shows them in the order
// given (a multi-row insert takes its sequence numbers in row order, so the
// batch keeps its FIFO order inside the job's queue).
func (q *Q) InsertTasks(ids []uuid.UUID, jobID uuid.UUID, roomID string, createdBy *uuid.UUID, payloads []string, timeouts []*int, scheds []TaskSched, status string) ([]Task, error) {
	if timeouts == nil {
		timeouts = make([]*int, len(ids))
	}
	if scheds == nil {
		scheds = make([]TaskSched, len(ids))
	}
	if len(ids) != len(payloads) || len(ids) != len(timeouts) || len(ids) != len(scheds) || len(ids) == 0 || len(ids) > MaxTaskBatch {
		return nil, fmt.Errorf("insert tasks: %d ids for %d payloads (1..%d)", len(ids), len(payloads), MaxTaskBatch)
	}
	var sb strings.Builder
	// Each task takes its job's limits (and its own task_timeout when
	// given), as InsertTaskTimeout's does.
	sb.WriteString("INSERT INTO tasks (id, job_id, room_id, created_by_id, payload, status, created_at, updated_at, task_timeout, heartbeat_timeout, priority, run_at, delayed) VALUES ")
	args := make([]any, 0, 10*len(ids))
	row := "(?, ?, ?, ?, ?, ?, " + q.now() + ", " + q.now() + ", COALESCE(?, (SELECT task_timeout FROM jobs WHERE id = ?)), (SELECT heartbeat_timeout FROM jobs WHERE id = ?), ?, "
	for i := range ids {
		if i > 0 {
			sb.WriteString(", ")
		}
		runAt, delayed, sargs := q.schedExprs(scheds[i])
		sb.WriteString(row + runAt + ", " + delayed + ")")
		args = append(args, ids[i], jobID, roomID, createdBy, payloads[i], status, timeouts[i], jobID, jobID, scheds[i].Priority)
		args = append(args, sargs...)
	}
	if err := q.g.Exec(sb.String(), args...).Error; err != nil {
		return nil, fmt.Errorf("insert tasks: %w", mapErr(err))
	}
	ts, err := q.GetTasks(ids)
	if err != nil {
		return nil, err
	}
	if len(ts) != len(ids) {
		return nil, fmt.Errorf("insert tasks: read back %d of %d", len(ts), len(ids))
	}
	return ts, nil
}

// ErrIdempotencyKeyGone: the key another transaction held was deleted
// before it could be read (retention); claiming again inserts it.
var ErrIdempotencyKeyGone = errors.New("idempotency key deleted while claimed")

// IdempotencyKey is a remembered submission: the hash of its request and
// the answer it got.
type IdempotencyKey struct {
	RequestHash string
	Response    string
}

// ClaimIdempotencyKey records key for user with the request's hash, unless
// the user already holds it within window (by the database's clock): then
// it returns the stored key and false. The (user_id, key) primary key makes
// two concurrent claims of one key on any node insert one row: the second
// waits for the first transaction and, once it committed, gets its row (on
// a rollback, the second inserts). A key older than window is replaced.
// Call it first in the submission's transaction and SetIdempotencyResponse
// before it commits.
func (q *Q) ClaimIdempotencyKey(userID uuid.UUID, key, requestHash string, window time.Duration) (IdempotencyKey, bool, error) {
	cutoff, arg := q.before(window)
	if err := q.g.Exec("DELETE FROM idempotency_keys WHERE user_id = ? AND key = ? AND created_at < "+cutoff, userID, key, arg).Error; err != nil {
		return IdempotencyKey{}, false, fmt.Errorf("expire idempotency key: %w", mapErr(err))
	}
	res := q.g.Exec("INSERT INTO idempotency_keys (user_id, key, request_hash, response, created_at) VALUES (?, ?, ?, '', "+q.now()+") ON CONFLICT (user_id, key) DO NOTHING",
		userID, key, requestHash)
	if res.Error != nil {
		return IdempotencyKey{}, false, fmt.Errorf("claim idempotency key: %w", mapErr(res.Error))
	}
	if res.RowsAffected == 1 {
		return IdempotencyKey{}, true, nil
	}
	var rows []struct {
		RequestHash string
		Response    string
	}
	if err := q.g.Raw("SELECT request_hash, response FROM idempotency_keys WHERE user_id = ? AND key = ?", userID, key).Scan(&rows).Error; err != nil {
		return IdempotencyKey{}, false, fmt.Errorf("read idempotency key: %w", mapErr(err))
	}
	if len(rows) == 0 {
		// Deleted between the two statements (retention): the caller retries.
		return IdempotencyKey{}, false, ErrIdempotencyKeyGone
	}
	return IdempotencyKey{RequestHash: rows[0].RequestHash, Response: rows[0].Response}, false, nil
}

// SetIdempotencyResponse stores the answer of the submission that claimed key.
func (q *Q) SetIdempotencyResponse(userID uuid.UUID, key, response string) error {
	if err := q.g.Exec("UPDATE idempotency_keys SET response = ? WHERE user_id = ? AND key = ?", response, userID, key).Error; err != nil {
		return fmt.Errorf("store idempotency response: %w", mapErr(err))
	}
	return nil
}

// PruneIdempotencyKeys deletes up to limit keys older than window by the
// database's clock, oldest first, and returns how many.
func (q *Q) PruneIdempotencyKeys(window time.Duration, limit int) (int64, error) {
	if window <= 0 {
		return 0, fmt.Errorf("prune idempotency keys: window must be positive, got %s", window)
	}
	limit = max(1, min(limit, MaxPruneBatch))
	cutoff, arg := q.before(window)
	var sql string
	if q.d == Postgres {
		sql = "WITH batch AS MATERIALIZED (SELECT user_id, key FROM idempotency_keys WHERE created_at < " + cutoff +
			" ORDER BY created_at LIMIT ? FOR UPDATE SKIP LOCKED) DELETE FROM idempotency_keys k USING batch b WHERE k.user_id = b.user_id AND k.key = b.key"
	} else {
		sql = "DELETE FROM idempotency_keys WHERE rowid IN (SELECT rowid FROM idempotency_keys WHERE created_at < " + cutoff + " ORDER BY created_at LIMIT ?)"
	}
	r := q.g.Exec(sql, arg, limit)
	if r.Error != nil {
		return 0, fmt.Errorf("prune idempotency keys: %w", mapErr(r.Error))
	}
	return r.RowsAffected, nil
}

// SetIdempotencyKeyAge moves a key's created_at to the database's now minus
// age (tests).
func (q *Q) SetIdempotencyKeyAge(userID uuid.UUID, key string, age time.Duration) error {
	expr, arg := q.before(age)
	if err := q.g.Exec("UPDATE idempotency_keys SET created_at = "+expr+" WHERE user_id = ? AND key = ?", arg, userID, key).Error; err != nil {
		return fmt.Errorf("set idempotency key age: %w", mapErr(err))
	}
	return nil
}
