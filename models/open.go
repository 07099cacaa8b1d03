package models

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// SupportedSchemes lists the database URL forms Open accepts, for messages.
const SupportedSchemes = "postgres://, postgresql://, sqlite://PATH, file:PATH, or a plain file path"

// ErrNoDatabase means the database to open does not exist (or has no joblib
// schema) and the caller asked not to create one.
var ErrNoDatabase = errors.New("no joblib database")

// ParseURL tells which database a URL names: PostgreSQL for postgres:// and
// postgresql://; SQLite, with the file's path, for sqlite://, file: or a
// plain path. Any other scheme (mysql://, http://, ...) is refused by name
// rather than taken for a file name.
func ParseURL(raw string) (d Dialect, path string, err error) {
	if raw == "" {
		return "", "", errors.New("database url is empty")
	}
	if strings.HasPrefix(raw, "postgres://") || strings.HasPrefix(raw, "postgresql://") {
		return Postgres, "", nil
	}
	path = raw
	switch {
	case strings.HasPrefix(raw, "sqlite://"):
		path = strings.TrimPrefix(raw, "sqlite://")
	case strings.HasPrefix(raw, "file:"):
		path = strings.TrimPrefix(raw, "file:")
	default:
		if scheme, _, ok := strings.Cut(raw, "://"); ok && !strings.ContainsAny(scheme, `/\.`) {
			return "", "", fmt.Errorf("unsupported database url scheme %q: use %s", scheme+"://", SupportedSchemes)
		}
	}
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	if path == "" {
		return "", "", fmt.Errorf("database url %q names no file", raw)
	}
	return SQLite, path, nil
}

// Describe names the database a URL points at for an operator: the SQLite
// file's absolute path, or the PostgreSQL URL without its password.
func Describe(raw string) string {
	d, path, err := ParseURL(raw)
	switch {
	case err != nil:
		return raw
	case d == SQLite:
		if abs, err := filepath.Abs(path); err == nil {
			return abs
		}
		return path
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "postgres://…"
	}
	return u.Redacted()
}

// checkSQLiteFile explains, before SQLite does (it would answer "out of
// memory (14)"), why the database file cannot be opened or created.
func checkSQLiteFile(path string, mustExist bool) error {
	st, err := os.Stat(path)
	switch {
	case err == nil && st.IsDir():
		return fmt.Errorf("SQLite database %s is a directory, not a file", path)
	case err == nil:
		// WAL mode needs to create the -wal and -shm files beside it.
		if !writable(filepath.Dir(path)) {
			return fmt.Errorf("SQLite database %s: directory %s is not writable by this user (WAL mode needs to create files beside the database)", path, filepath.Dir(path))
		}
		return nil
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("SQLite database %s: %w", path, err)
	case mustExist:
		return fmt.Errorf("%w at %s: run `joblib migrate` (or `joblib serve`) to create it, or point JOBLIB_DATABASE_URL at an existing database", ErrNoDatabase, absPath(path))
	}
	dir := filepath.Dir(path)
	dst, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("cannot create SQLite database %s: directory %s does not exist", path, dir)
	case err != nil:
		return fmt.Errorf("cannot create SQLite database %s: %w", path, err)
	case !dst.IsDir():
		return fmt.Errorf("cannot create SQLite database %s: %s is not a directory", path, dir)
	case !writable(dir):
		return fmt.Errorf("cannot create SQLite database %s: directory %s is not writable by this user", path, dir)
	}
	return nil
}

func absPath(p string) string {
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return p
}

// writable reports whether this process may create files in dir.
func writable(dir string) bool {
	return syscall.Access(dir, 0x2 /* W_OK */) == nil
}

// HasSchema reports whether joblib's migrations ever ran on this database.
func (db *DB) HasSchema(ctx context.Context) (bool, error) {
	var n int
	var err error
	if db.dialect == Postgres {
		err = db.gorm.WithContext(ctx).Raw("SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = 'schema_migrations'").Scan(&n).Error
	} else {
		err = db.gorm.WithContext(ctx).Raw("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'").Scan(&n).Error
	}
	if err != nil {
		return false, fmt.Errorf("look for the joblib schema: %w", err)
	}
	return n > 0, nil
}

// sqliteOpenError says what the operator must fix for the SQLite result
// codes an open can end with, instead of SQLite's terse text ("out of
// memory (14)" for a file it cannot open).
func sqliteOpenError(path string, err error) error {
	var coded interface{ Code() int }
	if errors.As(err, &coded) {
		switch coded.Code() & 0xff { // the primary result code
		case 5, 6: // SQLITE_BUSY, SQLITE_LOCKED
			return fmt.Errorf("SQLite database %s is locked by another process (stop it, or use PostgreSQL for several processes): %w", path, err)
		case 8: // SQLITE_READONLY
			return fmt.Errorf("SQLite database %s is read-only for this user: %w", path, err)
		case 11, 26: // SQLITE_CORRUPT, SQLITE_NOTADB
			return fmt.Errorf("%s is not a usable SQLite database (point JOBLIB_DATABASE_URL at a joblib database or a new file): %w", path, err)
		case 13: // SQLITE_FULL
			return fmt.Errorf("SQLite database %s: the disk is full: %w", path, err)
		case 14: // SQLITE_CANTOPEN
			return fmt.Errorf("cannot open SQLite database %s: check that its directory exists and this user may write there: %w", path, err)
		}
	}
	return fmt.Errorf("open sqlite %q: %w", path, err)
}
