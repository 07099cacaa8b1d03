package models

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"
	"modernc.org/sqlite"
)

// openSQLite opens and migrates a SQLite database in a temporary directory
// the way serve does.
func openSQLite(t *testing.T) (*DB, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "joblib.db")
	ctx := context.Background()
	db, err := Open(ctx, path, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return db, path
}

// Constraint violations come back as gorm's errors (and so as ErrConflict),
// still wrapping SQLite's; values come back as they went in.
func TestSQLiteDialect(t *testing.T) {
	t.Parallel()
	db, _ := openSQLite(t)
	ctx := context.Background()
	u, err := db.Q(ctx).CreateUser("alice", false)
	if err != nil {
		t.Fatal(err)
	}
	var se *sqlite.Error
	err = db.gorm.Exec("INSERT INTO users (id, name) VALUES (?, ?)", uuid.New(), "alice").Error
	if !errors.Is(err, gorm.ErrDuplicatedKey) || !errors.As(err, &se) || !errors.Is(mapErr(err), ErrConflict) {
		t.Fatalf("duplicate name: %v, want gorm.ErrDuplicatedKey wrapping the SQLite error", err)
	}
	err = db.gorm.Exec("INSERT INTO workers (id, user_id) VALUES (?, ?)", uuid.New(), uuid.New()).Error
	if !errors.Is(err, gorm.ErrForeignKeyViolated) || !errors.As(err, &se) || !errors.Is(mapErr(err), ErrConflict) {
		t.Fatalf("unknown user: %v, want gorm.ErrForeignKeyViolated wrapping the SQLite error", err)
	}
	err = db.gorm.Exec("INSERT INTO users (id) VALUES (?)", uuid.New()).Error
	if errors.Is(err, gorm.ErrDuplicatedKey) || errors.Is(err, gorm.ErrForeignKeyViolated) || !errors.Is(mapErr(err), ErrConflict) {
		t.Fatalf("missing name: %v, want a NOT NULL failure, a conflict but neither gorm error", err)
	}

	got, err := db.Q(ctx).UserByID(u.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != u.ID || got.Name != "alice" || !got.IsActive || got.IsSuperuser || got.Email != nil {
		t.Fatalf("user read back = %+v", got)
	}
	if age := time.Since(got.CreatedAt.Time); !got.CreatedAt.Valid() || age < -time.Minute || age > time.Minute {
		t.Fatalf("created_at = %v, want about now", got.CreatedAt)
	}
	// A time.Time argument is written in SQLite's own form (_time_format).
	var s string
	at := time.Date(2026, 11, 27, 5, 6, 7, 123456789, time.UTC)
	if err := db.gorm.Raw("SELECT ?", at).Scan(&s).Error; err != nil || s != "2026-11-27 05:06:07.123456789+00:00" {
		t.Fatalf("time argument stored as %q, %v", s, err)
	}
	var null Time
	if err := db.gorm.Raw("SELECT NULL").Scan(&null).Error; err != nil || null.Valid() {
		t.Fatalf("NULL time = %v, %v; want the zero value", null, err)
	}
}

func TestSQLiteQuoteTo(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"users": "`users`", "users.name": "`users`.`name`", "we`ird": "`we``ird`"} {
		var b strings.Builder
		sqliteDialector{}.QuoteTo(&b, in)
		if b.String() != want {
			t.Errorf("QuoteTo(%q) = %s, want %s", in, b.String(), want)
		}
	}
}
