package joblib

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"

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
// once; only its hash is stored.
func (s *Service) CreateToken(ctx context.Context, userName string, superuser bool) (string, Principal, error) {
	if userName == "" {
		return "", Principal{}, errors.New("user name is empty")
	}
	token := newToken()
	var u models.User
	err := s.db.Tx(ctx, func(q *models.Q) error {
		var err error
		u, err = q.UserByName(userName)
		switch {
		case errors.Is(err, models.ErrNotFound):
			u, err = q.CreateUser(userName, superuser)
		case err == nil && superuser && !u.IsSuperuser:
			err = q.SetSuperuser(u.ID, true)
			u.IsSuperuser = true
		}
		if err != nil {
			return err
		}
		return q.CreateAPIToken(u.ID, "cli", HashToken(token))
	})
	if err != nil {
		return "", Principal{}, fmt.Errorf("create token for %q: %w", userName, err)
	}
	return token, principal(u), nil
}

// EnsureAdminToken makes sure a superuser named "admin" exists and that token
// authenticates as it. Idempotent.
func (s *Service) EnsureAdminToken(ctx context.Context, token string) error {
	err := s.db.Tx(ctx, func(q *models.Q) error {
		// Nodes starting together all ensure the same user and token:
		// the schema lock makes the check-then-create one at a time.
		if err := q.LockSchema(); err != nil {
			return err
		}
		if _, err := q.UserByTokenHash(HashToken(token)); err == nil {
			return nil
		} else if !errors.Is(err, models.ErrNotFound) {
			return err
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
		return q.CreateAPIToken(u.ID, "admin-token", HashToken(token))
	})
	if err != nil {
		return fmt.Errorf("ensure admin token: %w", err)
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
		return q.CreateAPIToken(u.ID, "cli", HashToken(token))
	})
	if err != nil {
		return "", fmt.Errorf("create first admin: %w", err)
	}
	return token, nil
}

// HasUsers reports whether any user exists.
func (s *Service) HasUsers(ctx context.Context) (bool, error) {
	n, err := s.db.Q(ctx).CountUsers()
	return n > 0, err
}

// AuthenticateToken resolves an API token to its active user.
func (s *Service) AuthenticateToken(ctx context.Context, token string) (Principal, error) {
	u, err := s.db.Q(ctx).UserByTokenHash(HashToken(token))
	if errors.Is(err, models.ErrNotFound) || (err == nil && !u.IsActive) {
		return Principal{}, ErrUnauthorized
	}
	if err != nil {
		return Principal{}, err
	}
	return principal(u), nil
}

// PrincipalForSubject resolves the user id of a verified JWT, creating the
// user on first sight (the issuer vouches for it).
func (s *Service) PrincipalForSubject(ctx context.Context, id uuid.UUID) (Principal, error) {
	u, err := s.db.Q(ctx).EnsureUser(id)
	if err != nil {
		return Principal{}, err
	}
	if !u.IsActive {
		return Principal{}, ErrUnauthorized
	}
	return principal(u), nil
}

func principal(u models.User) Principal {
	return Principal{ID: u.ID, Name: u.Name, Superuser: u.IsSuperuser}
}
