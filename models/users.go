package models

import (
	"fmt"
	"time"

	"github.com/google/uuid"
)

const userCols = "id, name, email, is_active, is_superuser, created_at"

// CreateUser inserts a user. A taken name is ErrConflict.
func (q *Q) CreateUser(name string, superuser bool) (User, error) {
	var u User
	err := q.g.Raw("INSERT INTO users (id, name, is_superuser, created_at) VALUES (?, ?, ?, "+q.now()+") RETURNING "+userCols,
		uuid.New(), name, superuser).Scan(&u).Error
	if err != nil {
		return User{}, fmt.Errorf("create user %q: %w", name, mapErr(err))
	}
	return u, nil
}

// EnsureUser returns the user with this id, creating it (named after the id,
// not a superuser) if it does not exist. Used for identities vouched for by a
// trusted JWT issuer.
func (q *Q) EnsureUser(id uuid.UUID) (User, error) {
	err := q.g.Exec("INSERT INTO users (id, name, created_at) VALUES (?, ?, "+q.now()+") ON CONFLICT DO NOTHING", id, id.String()).Error
	if err != nil {
		return User{}, fmt.Errorf("ensure user %s: %w", id, mapErr(err))
	}
	return q.UserByID(id)
}

// UserByID looks a user up by id.
func (q *Q) UserByID(id uuid.UUID) (User, error) {
	return q.oneUser("WHERE id = ?", id)
}

// UserByName looks a user up by name.
func (q *Q) UserByName(name string) (User, error) {
	return q.oneUser("WHERE name = ?", name)
}

func (q *Q) oneUser(where string, args ...any) (User, error) {
	var us []User
	if err := q.g.Raw("SELECT "+userCols+" FROM users "+where, args...).Scan(&us).Error; err != nil {
		return User{}, fmt.Errorf("read user: %w", mapErr(err))
	}
	if len(us) == 0 {
		return User{}, ErrNotFound
	}
	return us[0], nil
}

// SetSuperuser changes a user's superuser flag.
func (q *Q) SetSuperuser(id uuid.UUID, superuser bool) error {
	return mapErr(q.g.Exec("UPDATE users SET is_superuser = ? WHERE id = ?", superuser, id).Error)
}

// CountUsers counts all users.
func (q *Q) CountUsers() (int64, error) {
	var n int64
	err := q.g.Raw("SELECT count(*) FROM users").Scan(&n).Error
	return n, mapErr(err)
}

// CountSuperusers counts the active superusers, leaving out those whose
// name starts with except (the CLI's operator users).
func (q *Q) CountSuperusers(except string) (int64, error) {
	var n int64
	err := q.g.Raw("SELECT count(*) FROM users WHERE is_superuser = ? AND is_active = ? AND substr(name, 1, ?) <> ?", true, true, len(except), except).Scan(&n).Error
	return n, mapErr(err)
}

// APIToken is an API token's record (never the token itself: only its hash
// is stored), with the name of the user it belongs to.
type APIToken struct {
	ID         uuid.UUID
	UserID     uuid.UUID
	UserName   string
	Name       string
	CreatedAt  Time
	LastUsedAt Time
	ExpiresAt  Time
	RevokedAt  Time
}

const tokenCols = "t.id, t.user_id, u.name AS user_name, t.name, t.created_at, t.last_used_at, t.expires_at, t.revoked_at"

// CreateAPIToken stores the hash of a new API token for a user and returns
// its id. A zero expiresAt means the token does not expire.
func (q *Q) CreateAPIToken(userID uuid.UUID, name, tokenHash string, expiresAt Time) (uuid.UUID, error) {
	id := uuid.New()
	err := q.g.Exec("INSERT INTO api_tokens (id, user_id, token_hash, name, expires_at, created_at) VALUES (?, ?, ?, ?, ?, "+q.now()+")",
		id, userID, tokenHash, name, expiresAt).Error
	if err != nil {
		return uuid.Nil, fmt.Errorf("create api token: %w", mapErr(err))
	}
	return id, nil
}

// TokenLookup is what authentication learns about a token hash: the token,
// its user, and whether the token expired by the database's clock.
type TokenLookup struct {
	Token   APIToken
	User    User
	Expired bool
}

// TokenByHash finds an API token (revoked and expired ones included) and its
// user by the token's hash.
func (q *Q) TokenByHash(tokenHash string) (TokenLookup, error) {
	var rows []struct {
		APIToken
		IsActive    bool
		IsSuperuser bool
		Expired     bool
	}
	err := q.g.Raw("SELECT "+tokenCols+", u.is_active, u.is_superuser, (t.expires_at IS NOT NULL AND t.expires_at <= "+q.now()+") AS expired"+
		" FROM api_tokens t JOIN users u ON u.id = t.user_id WHERE t.token_hash = ?", tokenHash).Scan(&rows).Error
	if err != nil {
		return TokenLookup{}, fmt.Errorf("read api token: %w", mapErr(err))
	}
	if len(rows) == 0 {
		return TokenLookup{}, ErrNotFound
	}
	r := rows[0]
	return TokenLookup{Token: r.APIToken, Expired: r.Expired,
		User: User{ID: r.UserID, Name: r.UserName, IsActive: r.IsActive, IsSuperuser: r.IsSuperuser}}, nil
}

// ListAPITokens lists tokens, newest first, optionally of one user only.
func (q *Q) ListAPITokens(userID *uuid.UUID) ([]APIToken, error) {
	where, args := "", []any{}
	if userID != nil {
		where, args = " WHERE t.user_id = ?", append(args, *userID)
	}
	var ts []APIToken
	err := q.g.Raw("SELECT "+tokenCols+" FROM api_tokens t JOIN users u ON u.id = t.user_id"+where+" ORDER BY t.created_at DESC, t.id", args...).Scan(&ts).Error
	if err != nil {
		return nil, fmt.Errorf("list api tokens: %w", mapErr(err))
	}
	return ts, nil
}

// GetAPIToken reads one token record by id.
func (q *Q) GetAPIToken(id uuid.UUID) (APIToken, error) {
	var ts []APIToken
	err := q.g.Raw("SELECT "+tokenCols+" FROM api_tokens t JOIN users u ON u.id = t.user_id WHERE t.id = ?", id).Scan(&ts).Error
	if err != nil {
		return APIToken{}, fmt.Errorf("read api token: %w", mapErr(err))
	}
	if len(ts) == 0 {
		return APIToken{}, ErrNotFound
	}
	return ts[0], nil
}

// RevokeAPITokens marks the given tokens revoked (those not revoked yet) and
// returns the ids it revoked.
func (q *Q) RevokeAPITokens(ids []uuid.UUID) ([]uuid.UUID, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	var out []uuid.UUID
	err := q.g.Raw("UPDATE api_tokens SET revoked_at = "+q.now()+" WHERE id IN ? AND revoked_at IS NULL RETURNING id", ids).Scan(&out).Error
	if err != nil {
		return nil, fmt.Errorf("revoke api tokens: %w", mapErr(err))
	}
	return out, nil
}

// TouchAPIToken records that a token was used now, unless that was recorded
// less than minAge ago (several nodes may touch the same token).
func (q *Q) TouchAPIToken(id uuid.UUID, minAge time.Duration) error {
	before, arg := q.before(minAge)
	err := q.g.Exec("UPDATE api_tokens SET last_used_at = "+q.now()+" WHERE id = ? AND (last_used_at IS NULL OR last_used_at < "+before+")", id, arg).Error
	if err != nil {
		return fmt.Errorf("touch api token: %w", mapErr(err))
	}
	return nil
}

// LockUser serialises the quota checks of one user's creations on
// PostgreSQL (SQLite serialises every writing transaction anyway). The lock
// does not block inserts that merely reference the user.
func (q *Q) LockUser(id uuid.UUID) error {
	if q.d != Postgres {
		return nil
	}
	var got []uuid.UUID
	if err := q.g.Raw("SELECT id FROM users WHERE id = ? FOR NO KEY UPDATE", id).Scan(&got).Error; err != nil {
		return fmt.Errorf("lock user: %w", mapErr(err))
	}
	return nil
}

// PendingBound reads the user's pending-task bound (see migration 170): when
// ok, the user has at most bound pending tasks. On PostgreSQL call it under
// the user's quota lock (LockUser), which every writer of the bound but the
// forgetting ones holds.
func (q *Q) PendingBound(id uuid.UUID) (bound int64, ok bool, err error) {
	var got []struct{ PendingBound *int64 }
	if err := q.g.Raw("SELECT pending_bound FROM users WHERE id = ?", id).Scan(&got).Error; err != nil {
		return 0, false, fmt.Errorf("read pending bound: %w", mapErr(err))
	}
	if len(got) == 0 || got[0].PendingBound == nil {
		return 0, false, nil
	}
	return *got[0].PendingBound, true, nil
}

// SetPendingBound stores the user's pending-task bound, under the quota lock,
// in the transaction that adds the tasks it counts.
func (q *Q) SetPendingBound(id uuid.UUID, bound int64) error {
	if err := q.g.Exec("UPDATE users SET pending_bound = ? WHERE id = ?", bound, id).Error; err != nil {
		return fmt.Errorf("store pending bound: %w", mapErr(err))
	}
	return nil
}

// ForgetPendingBound drops the user's pending-task bound, so that the next
// submission under a quota counts: for pending tasks added without the quota
// (none configured, or a superuser's). It writes nothing when there is none.
func (q *Q) ForgetPendingBound(id uuid.UUID) error {
	if err := q.g.Exec("UPDATE users SET pending_bound = NULL WHERE id = ? AND pending_bound IS NOT NULL", id).Error; err != nil {
		return fmt.Errorf("forget pending bound: %w", mapErr(err))
	}
	return nil
}

// Usage kinds counted by CountUsage.
const (
	UsageWorkers      = "workers"
	UsageProviders    = "providers"
	UsagePendingTasks = "pending_tasks"
)

// CountUsage counts a user's workers, providers or pending tasks, stopping
// at upTo (a quota check needs no more).
func (q *Q) CountUsage(userID uuid.UUID, kind string, upTo int) (int64, error) {
	var sub string
	switch kind {
	case UsageWorkers:
		sub = "SELECT 1 FROM workers WHERE user_id = ? LIMIT ?"
	case UsageProviders:
		sub = "SELECT 1 FROM providers WHERE user_id = ? LIMIT ?"
	case UsagePendingTasks:
		sub = "SELECT 1 FROM tasks WHERE created_by_id = ? AND status = 'pending' LIMIT ?"
	default:
		return 0, fmt.Errorf("count usage: unknown kind %q", kind)
	}
	var n int64
	if err := q.g.Raw("SELECT count(*) FROM ("+sub+") AS u", userID, upTo).Scan(&n).Error; err != nil {
		return 0, fmt.Errorf("count %s: %w", kind, mapErr(err))
	}
	return n, nil
}
