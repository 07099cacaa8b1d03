package models

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
)

// migration is one schema version, read from its two files in migrations/
// (see migrationFS): the DDL differs by dialect because the two databases
// differ in types (uuid, timestamptz, identity columns).
type migration struct {
	version int
	name    string
	// down says, in words and SQL, how an operator reverts the version by
	// hand; joblib itself never migrates down.
	down     string
	postgres []string
	sqlite   []string
}

// migrationFS holds one file per version and dialect,
// NNNN_slug.postgres.sql and NNNN_slug.sqlite.sql (docs/architecture.md,
// "How to add a migration"). Released files are never edited: a change is a
// new version.
//
//go:embed migrations/*.sql
var migrationFS embed.FS

// migrations are every version, in order, parsed once at start.
var migrations = mustLoadMigrations(migrationFS)

// LatestSchemaVersion is the newest schema version this binary knows.
func LatestSchemaVersion() int { return migrations[len(migrations)-1].version }

func mustLoadMigrations(fsys fs.FS) []migration {
	ms, err := loadMigrations(fsys)
	if err != nil {
		panic(err)
	}
	return ms
}

// loadMigrations reads and checks the migration files: both dialects for
// every version, the same name in both, a down note, no version twice.
func loadMigrations(fsys fs.FS) ([]migration, error) {
	names, err := fs.Glob(fsys, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	byVersion := map[int]*migration{}
	seen := map[int]map[string]string{} // version -> dialect -> file
	for _, file := range names {
		base := path.Base(file)
		rest, ok := strings.CutSuffix(base, ".sql")
		dot := strings.LastIndexByte(rest, '.')
		if !ok || dot < 0 {
			return nil, fmt.Errorf("migration file %s: want NNNN_name.postgres.sql or NNNN_name.sqlite.sql", base)
		}
		dialect := rest[dot+1:]
		if dialect != "postgres" && dialect != "sqlite" {
			return nil, fmt.Errorf("migration file %s: dialect %q is neither postgres nor sqlite", base, dialect)
		}
		num, _, ok := strings.Cut(rest[:dot], "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 || len(num) != 4 {
			return nil, fmt.Errorf("migration file %s: want a four-digit version before the first underscore", base)
		}
		if seen[v] == nil {
			seen[v] = map[string]string{}
		}
		if other, dup := seen[v][dialect]; dup {
			return nil, fmt.Errorf("migration %d has two %s files: %s and %s", v, dialect, other, base)
		}
		seen[v][dialect] = base
		raw, err := fs.ReadFile(fsys, file)
		if err != nil {
			return nil, err
		}
		name, down, stmts, err := parseMigration(string(raw))
		if err != nil {
			return nil, fmt.Errorf("migration file %s: %w", base, err)
		}
		m := byVersion[v]
		if m == nil {
			m = &migration{version: v, name: name, down: down}
			byVersion[v] = m
		} else if m.name != name {
			return nil, fmt.Errorf("migration %d: the dialects' files name it %q and %q", v, m.name, name)
		}
		if dialect == "postgres" {
			m.postgres = stmts
		} else {
			m.sqlite = stmts
		}
	}
	out := make([]migration, 0, len(byVersion))
	for v, m := range byVersion {
		if len(seen[v]) != 2 {
			return nil, fmt.Errorf("migration %d has only %v: every version needs a postgres and a sqlite file (a comment alone when a dialect has nothing to do)", v, slices.Sorted(maps.Values(seen[v])))
		}
		out = append(out, *m)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no migration files")
	}
	slices.SortFunc(out, func(a, b migration) int { return a.version - b.version })
	return out, nil
}

// parseMigration reads one migration file. It starts with a "-- name:" line
// (recorded in schema_migrations) and a "-- down:" note (continued on the
// comment lines that follow it). Then come statements separated by
// semicolons; comment lines are dropped. A statement with semicolons of its
// own (a function or trigger body) stands between "-- statement begin" and
// "-- statement end" lines and is run as written.
func parseMigration(text string) (name, down string, stmts []string, err error) {
	var pending strings.Builder
	flush := func() {
		for s := range strings.SplitSeq(pending.String(), ";") {
			if s = strings.TrimSpace(s); s != "" {
				stmts = append(stmts, s)
			}
		}
		pending.Reset()
	}
	var block *strings.Builder
	inDown := false
	for line := range strings.Lines(text) {
		trimmed := strings.TrimSpace(line)
		if block != nil {
			if trimmed == "-- statement end" {
				if s := strings.TrimSuffix(strings.TrimSpace(block.String()), ";"); s != "" {
					stmts = append(stmts, s)
				}
				block = nil
				continue
			}
			block.WriteString(line)
			continue
		}
		switch {
		case trimmed == "-- statement begin":
			flush()
			block = &strings.Builder{}
			inDown = false
		case strings.HasPrefix(trimmed, "-- name:") && name == "":
			name = strings.TrimSpace(strings.TrimPrefix(trimmed, "-- name:"))
			inDown = false
		case strings.HasPrefix(trimmed, "-- down:") && down == "":
			down = strings.TrimSpace(strings.TrimPrefix(trimmed, "-- down:"))
			inDown = true
		case strings.HasPrefix(trimmed, "--"):
			if c := strings.TrimSpace(strings.TrimPrefix(trimmed, "--")); inDown && c != "" {
				down += " " + c
			} else {
				inDown = false
			}
		default:
			inDown = false
			pending.WriteString(line)
		}
	}
	if block != nil {
		return "", "", nil, fmt.Errorf("\"-- statement begin\" without \"-- statement end\"")
	}
	flush()
	if name == "" {
		return "", "", nil, fmt.Errorf("no \"-- name:\" line")
	}
	if down == "" {
		return "", "", nil, fmt.Errorf("no \"-- down:\" note (how to revert the version by hand)")
	}
	return name, down, stmts, nil
}

// ErrSchemaTooNew is returned by Migrate when the database holds a schema
// version this binary does not know: a newer joblib migrated it, and this
// one would misread it.
var ErrSchemaTooNew = errors.New("database schema is newer than this binary")

// SchemaLockSQL takes the transaction-scoped advisory lock that serialises
// every schema change joblib makes (migrations, first bootstrap rows) among
// the processes sharing a schema. Anything that runs
// DDL or a check-then-create at start takes it, so that any number of nodes
// may start together on an empty database.
const SchemaLockSQL = "SELECT pg_advisory_xact_lock(hashtext('joblib:schema'), hashtext(current_schema()))"

// LockSchema takes the schema lock for the rest of the transaction
// (PostgreSQL; SQLite serialises writers anyway).
func (q *Q) LockSchema() error {
	if q.d != Postgres {
		return nil
	}
	if err := q.g.Exec(SchemaLockSQL).Error; err != nil {
		return fmt.Errorf("lock schema: %w", err)
	}
	return nil
}

// Migrate brings the schema to the newest version. It is safe to run from
// several processes at once on PostgreSQL (the schema lock serialises them)
// and idempotent everywhere. It returns the versions it applied.
func (db *DB) Migrate(ctx context.Context) ([]int, error) {
	var applied []int
	err := db.Tx(ctx, func(q *Q) error {
		if db.dialect == Postgres {
			if err := q.LockSchema(); err != nil {
				return err
			}
		}
		ts := "timestamptz NOT NULL DEFAULT now()"
		if db.dialect == SQLite {
			ts = "TEXT NOT NULL DEFAULT (" + sqliteNow + ")"
		}
		if err := q.g.Exec("CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at " + ts + ")").Error; err != nil {
			return fmt.Errorf("create schema_migrations: %w", err)
		}
		var have []int
		if err := q.g.Raw("SELECT version FROM schema_migrations ORDER BY version").Scan(&have).Error; err != nil {
			return fmt.Errorf("read schema_migrations: %w", err)
		}
		done := map[int]bool{}
		for _, v := range have {
			done[v] = true
		}
		if len(have) > 0 && have[len(have)-1] > LatestSchemaVersion() {
			return fmt.Errorf("%w: the database is at version %d, this binary knows versions up to %d; run the newer joblib that migrated it", ErrSchemaTooNew, have[len(have)-1], LatestSchemaVersion())
		}
		for _, m := range migrations {
			if done[m.version] {
				continue
			}
			stmts := m.postgres
			if db.dialect == SQLite {
				stmts = m.sqlite
			}
			for _, stmt := range stmts {
				if err := q.g.Exec(stmt).Error; err != nil {
					return fmt.Errorf("migration %d (%s): %w", m.version, m.name, err)
				}
			}
			if err := q.g.Exec("INSERT INTO schema_migrations (version, name) VALUES (?, ?)", m.version, m.name).Error; err != nil {
				return fmt.Errorf("record migration %d: %w", m.version, err)
			}
			applied = append(applied, m.version)
		}
		return nil
	})
	return applied, err
}

// SchemaVersion is the newest migration recorded in the database (0 if none).
func (db *DB) SchemaVersion(ctx context.Context) (int, error) {
	var v *int
	err := db.gorm.WithContext(ctx).Raw("SELECT max(version) FROM schema_migrations").Scan(&v).Error
	if err != nil || v == nil {
		return 0, err
	}
	return *v, nil
}
