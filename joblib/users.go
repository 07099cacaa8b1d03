package joblib

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/models"
)

// ErrUnauthorized means the credentials are missing, unknown or inactive.
var ErrUnauthorized = errors.New("unauthorized")

// TokenPrefix starts every API token joblib issues.
const TokenPrefix = "jl_"

// HashToken is how API tokens are stored: only their SHA-256.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

func newToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms
	return TokenPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// CreateToken issues a new API token for the named user, creating the user if
// needed. superuser=true also promotes an existing user. The token is shown
// once; only its hash is stored. It does not expire.
func (s *Service) CreateToken(ctx context.Context, userName string, superuser bool) (string, Principal, error) {
	tok, _, p, err := s.IssueToken(ctx, TokenRequest{User: userName, Superuser: superuser})
	return tok, p, err
}

// TokenRequest describes a token to issue.
type TokenRequest struct {
	User      string
	Superuser bool
	// TTL > 0 makes the token expire that long after its creation (by the
	// database's clock).
	TTL time.Duration
	// Actor, when set, is recorded in the audit log as who issued it.
	Actor string
}

// IssueToken issues an API token as described and returns it with its id.
func (s *Service) IssueToken(ctx context.Context, r TokenRequest) (string, uuid.UUID, Principal, error) {
	if r.User == "" {
		return "", uuid.Nil, Principal{}, errors.New("user name is empty")
	}
	if r.TTL < 0 {
		return "", uuid.Nil, Principal{}, errors.New("token ttl must not be negative")
	}
	token := newToken()
	var (
		u  models.User
		id uuid.UUID
	)
	err := s.db.Tx(ctx, func(q *models.Q) error {
		var err error
		u, err = q.UserByName(r.User)
		switch {
		case errors.Is(err, models.ErrNotFound):
			u, err = q.CreateUser(r.User, r.Superuser)
		case err == nil && r.Superuser && !u.IsSuperuser:
			err = q.SetSuperuser(u.ID, true)
			u.IsSuperuser = true
		}
		if err != nil {
			return err
		}
		var exp models.Time
		if r.TTL > 0 {
			now, err := q.DBNow()
			if err != nil {
				return err
			}
			exp = models.Time{Time: now.Add(r.TTL)}
		}
		if id, err = q.CreateAPIToken(u.ID, "cli", HashToken(token), exp); err != nil {
			return err
		}
		if r.Actor == "" {
			return nil
		}
		return audit(q, AuditTokenCreate, &id, r.Actor, map[string]any{"user": u.Name, "user_id": u.ID, "superuser": u.IsSuperuser, "expires_at": exp.Ptr()})
	})
	if err != nil {
		return "", uuid.Nil, Principal{}, fmt.Errorf("create token for %q: %w", r.User, err)
	}
	return token, id, principal(u), nil
}

// adminTokenName marks the tokens JOBLIB_ADMIN_TOKEN created.
const adminTokenName = "admin-token"

// ErrAdminTokenRevoked means JOBLIB_ADMIN_TOKEN names a token an operator
// revoked: the server refuses to start rather than resurrect it.
var ErrAdminTokenRevoked = errors.New("JOBLIB_ADMIN_TOKEN was revoked (joblib token revoke); set a new value")

// EnsureAdminToken makes sure a superuser named "admin" exists and that token
// authenticates as it. Idempotent. A token an earlier JOBLIB_ADMIN_TOKEN
// created is revoked when the value changes, so rotating the variable retires
// the old secret.
func (s *Service) EnsureAdminToken(ctx context.Context, token string) error {
	var revoked []uuid.UUID
	err := s.db.Tx(ctx, func(q *models.Q) error {
		// Nodes starting together all ensure the same user and token:
		// the schema lock makes the check-then-create one at a time.
		if err := q.LockSchema(); err != nil {
			return err
		}
		hash := HashToken(token)
		cur, err := q.TokenByHash(hash)
		switch {
		case err == nil && cur.Token.RevokedAt.Valid():
			return ErrAdminTokenRevoked
		case err == nil && cur.Token.Name != adminTokenName:
			return fmt.Errorf("JOBLIB_ADMIN_TOKEN is a token of user %q issued by other means; set a new value", cur.User.Name)
		case err != nil && !errors.Is(err, models.ErrNotFound):
			return err
		}
		keep := uuid.Nil
		if err == nil {
			keep = cur.Token.ID
		}
		all, err := q.ListAPITokens(nil)
		if err != nil {
			return err
		}
		var old []uuid.UUID
		for _, t := range all {
			if t.Name == adminTokenName && t.ID != keep && !t.RevokedAt.Valid() {
				old = append(old, t.ID)
			}
		}
		if revoked, err = q.RevokeAPITokens(old); err != nil {
			return err
		}
		for _, id := range revoked {
			if err := audit(q, AuditTokenRevoke, &id, "startup", map[string]any{"reason": "JOBLIB_ADMIN_TOKEN changed"}); err != nil {
				return err
			}
		}
		if keep != uuid.Nil {
			return nil
		}
		u, err := q.UserByName("admin")
		switch {
		case errors.Is(err, models.ErrNotFound):
			u, err = q.CreateUser("admin", true)
		case err == nil && !u.IsSuperuser:
			err = q.SetSuperuser(u.ID, true)
		}
		if err != nil {
			return err
		}
		_, err = q.CreateAPIToken(u.ID, adminTokenName, hash, models.Time{})
		return err
	})
	if err != nil {
		return fmt.Errorf("ensure admin token: %w", err)
	}
	if len(revoked) > 0 {
		s.log.Warn("JOBLIB_ADMIN_TOKEN changed: revoked the token(s) the previous value created", "tokens", revoked)
	}
	return nil
}

// CreateFirstAdmin creates a superuser "admin" with a new API token when the
// database has no user at all, and returns the token; it returns "" when
// users exist. Nodes starting together on an empty database create one
// admin between them (the schema lock orders them).
func (s *Service) CreateFirstAdmin(ctx context.Context) (string, error) {
	var token string
	err := s.db.Tx(ctx, func(q *models.Q) error {
		token = ""
		if err := q.LockSchema(); err != nil { // one first admin among nodes starting together
			return err
		}
		n, err := q.CountUsers()
		if err != nil || n > 0 {
			return err
		}
		u, err := q.CreateUser("admin", true)
		if err != nil {
			return err
		}
		token = newToken()
		_, err = q.CreateAPIToken(u.ID, "cli", HashToken(token), models.Time{})
		return err
	})
	if err != nil {
		return "", fmt.Errorf("create first admin: %w", err)
	}
	return token, nil
}

// HasSuperuser reports whether an active superuser exists besides the
// CLI's operator users (whom nobody logs in as).
func (s *Service) HasSuperuser(ctx context.Context) (bool, error) {
	n, err := s.db.Q(ctx).CountSuperusers(OperatorUserPrefix)
	return n > 0, err
}

// HasUsers reports whether any user exists.
func (s *Service) HasUsers(ctx context.Context) (bool, error) {
	n, err := s.db.Q(ctx).CountUsers()
	return n > 0, err
}

// AuthError is an authentication refusal with its reason. It matches
// ErrUnauthorized with errors.Is.
type AuthError struct{ Reason string }

func (e *AuthError) Error() string { return "unauthorized: " + e.Reason }

// Is makes errors.Is(err, ErrUnauthorized) hold.
func (e *AuthError) Is(target error) bool { return target == ErrUnauthorized }

// Unauthorized returns an ErrUnauthorized carrying a reason for the client.
func Unauthorized(format string, args ...any) error {
	return &AuthError{Reason: fmt.Sprintf(format, args...)}
}

// tokenTouchEvery is how often a token's last_used_at is written at most
// (per process; the statement itself also skips fresher values).
const tokenTouchEvery = time.Minute

// AuthenticateToken resolves an API token to its active user. Revoked and
// expired tokens are refused with a reason; last use is recorded at most once
// a minute per token.
func (s *Service) AuthenticateToken(ctx context.Context, token string) (Principal, error) {
	q := s.db.Q(ctx)
	l, err := q.TokenByHash(HashToken(token))
	if errors.Is(err, models.ErrNotFound) {
		return Principal{}, ErrUnauthorized
	}
	if err != nil {
		return Principal{}, err
	}
	switch {
	case l.Token.RevokedAt.Valid():
		return Principal{}, Unauthorized("Token revoked")
	case l.Expired:
		return Principal{}, Unauthorized("Token expired")
	case !l.User.IsActive:
		return Principal{}, Unauthorized("User inactive")
	}
	s.touchToken(ctx, q, l.Token.ID)
	return principal(l.User), nil
}

func (s *Service) touchToken(ctx context.Context, q *models.Q, id uuid.UUID) {
	now := time.Now()
	if v, ok := s.touched.Load(id); ok && now.Sub(v.(time.Time)) < tokenTouchEvery {
		return
	}
	s.touched.Store(id, now)
	if err := q.TouchAPIToken(id, tokenTouchEvery); err != nil && ctx.Err() == nil {
		// Last use is bookkeeping; authentication does not fail on it.
		s.log.Warn("record token use", "token_id", id, "err", err)
	}
}

// TokenInfo is a token as `joblib token list` shows it (never the secret).
type TokenInfo struct {
	ID        uuid.UUID  `json:"id"`
	UserID    uuid.UUID  `json:"user_id"`
	User      string     `json:"user"`
	Name      string     `json:"name"`
	CreatedAt time.Time  `json:"created_at"`
	LastUsed  *time.Time `json:"last_used_at"`
	ExpiresAt *time.Time `json:"expires_at"`
	RevokedAt *time.Time `json:"revoked_at"`
}

// ListTokens lists API tokens, newest first; userName filters to one user.
func (s *Service) ListTokens(ctx context.Context, userName string) ([]TokenInfo, error) {
	q := s.db.Q(ctx)
	var uid *uuid.UUID
	if userName != "" {
		u, err := q.UserByName(userName)
		if err != nil {
			return nil, notFoundUser(err, userName)
		}
		uid = &u.ID
	}
	ts, err := q.ListAPITokens(uid)
	if err != nil {
		return nil, err
	}
	out := make([]TokenInfo, len(ts))
	for i, t := range ts {
		out[i] = TokenInfo{ID: t.ID, UserID: t.UserID, User: t.UserName, Name: t.Name, CreatedAt: t.CreatedAt.UTC(),
			LastUsed: t.LastUsedAt.Ptr(), ExpiresAt: t.ExpiresAt.Ptr(), RevokedAt: t.RevokedAt.Ptr()}
	}
	return out, nil
}

func notFoundUser(err error, name string) error {
	if errors.Is(err, models.ErrNotFound) {
		return fmt.Errorf("no user named %q", name)
	}
	return err
}

// RevokeToken revokes one token by id (audited). Revoking a revoked token
// is an error naming when it was revoked.
func (s *Service) RevokeToken(ctx context.Context, id uuid.UUID, actor string) (TokenInfo, error) {
	var out TokenInfo
	err := s.db.Tx(ctx, func(q *models.Q) error {
		t, err := q.GetAPIToken(id)
		if errors.Is(err, models.ErrNotFound) {
			return fmt.Errorf("no token with id %s", id)
		}
		if err != nil {
			return err
		}
		if t.RevokedAt.Valid() {
			return fmt.Errorf("token %s was already revoked at %s", id, t.RevokedAt.UTC().Format(time.RFC3339))
		}
		if _, err := q.RevokeAPITokens([]uuid.UUID{id}); err != nil {
			return err
		}
		out = TokenInfo{ID: t.ID, UserID: t.UserID, User: t.UserName, Name: t.Name, CreatedAt: t.CreatedAt.UTC()}
		return audit(q, AuditTokenRevoke, &id, actor, map[string]any{"user": t.UserName, "user_id": t.UserID})
	})
	return out, err
}

// RevokeUserTokens revokes every live token of a user (audited, one row per
// token) and returns their ids.
func (s *Service) RevokeUserTokens(ctx context.Context, userName, actor string) ([]uuid.UUID, error) {
	var out []uuid.UUID
	err := s.db.Tx(ctx, func(q *models.Q) error {
		u, err := q.UserByName(userName)
		if err != nil {
			return notFoundUser(err, userName)
		}
		ts, err := q.ListAPITokens(&u.ID)
		if err != nil {
			return err
		}
		var ids []uuid.UUID
		for _, t := range ts {
			if !t.RevokedAt.Valid() {
				ids = append(ids, t.ID)
			}
		}
		if out, err = q.RevokeAPITokens(ids); err != nil {
			return err
		}
		for _, id := range out {
			if err := audit(q, AuditTokenRevoke, &id, actor, map[string]any{"user": u.Name, "user_id": u.ID}); err != nil {
				return err
			}
		}
		return nil
	})
	return out, err
}

// PrincipalForSubject resolves the user id of a verified JWT, creating the
// user on first sight (the issuer vouches for it).
func (s *Service) PrincipalForSubject(ctx context.Context, id uuid.UUID) (Principal, error) {
	u, err := s.db.Q(ctx).EnsureUser(id)
	if err != nil {
		return Principal{}, err
	}
	if !u.IsActive {
		return Principal{}, Unauthorized("User inactive")
	}
	return principal(u), nil
}

func principal(u models.User) Principal {
	return Principal{ID: u.ID, Name: u.Name, Superuser: u.IsSuperuser}
}
