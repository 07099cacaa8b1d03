package models

import (
	"fmt"

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

// CreateAPIToken stores the hash of a new API token for a user.
func (q *Q) CreateAPIToken(userID uuid.UUID, name, tokenHash string) error {
	err := q.g.Exec("INSERT INTO api_tokens (id, user_id, token_hash, name, created_at) VALUES (?, ?, ?, ?, "+q.now()+")",
		uuid.New(), userID, tokenHash, name).Error
	if err != nil {
		return fmt.Errorf("create api token: %w", mapErr(err))
	}
	return nil
}

// UserByTokenHash finds the user an API token hash belongs to.
func (q *Q) UserByTokenHash(tokenHash string) (User, error) {
	return q.oneUser("WHERE id = (SELECT user_id FROM api_tokens WHERE token_hash = ?)", tokenHash)
}
