// Package dbtest gives tests a fresh, migrated joblib database on each
// dialect: a SQLite file in t.TempDir(), and a private schema in the
// PostgreSQL named by JOBLIB_TEST_DATABASE_URL (scripts/test.sh starts one).
// A missing PostgreSQL fails the test: the suite must never silently run
// against one database only.
package dbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/models"
)

// DefaultPostgresURL is used when JOBLIB_TEST_DATABASE_URL is not set.
const DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// Dialects are the databases every storage and API test runs on.
var Dialects = []models.Dialect{models.SQLite, models.Postgres}

// PostgresURL is the base URL of the test PostgreSQL.
func PostgresURL() string {
	if u := os.Getenv("JOBLIB_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultPostgresURL
}

// Each runs fn as a subtest per dialect, each with its own fresh database.
func Each(t *testing.T, fn func(t *testing.T, db *models.DB)) {
	t.Helper()
	for _, d := range Dialects {
		t.Run(string(d), func(t *testing.T) {
			fn(t, Open(t, d))
		})
	}
}

// Open returns a migrated database of the dialect, closed and dropped at the
// end of the test.
func Open(t testing.TB, d models.Dialect) *models.DB {
	t.Helper()
	db := openMigrated(t, d, URL(t, d))
	t.Cleanup(func() { db.Close() })
	return db
}

// openMigrated opens the test database at u and migrates it; the caller
// closes it.
func openMigrated(t testing.TB, d models.Dialect, u string) *models.DB {
	t.Helper()
	// Generous: dozens of packages' tests migrate their own schemas at
	// once, and on a machine whose disk stalls each DDL commit waits for
	// its flush (a CI run once took over 30 s here).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, err := models.Open(ctx, u, models.OpenOptions{})
	if err != nil {
		t.Fatalf("open %s test database: %v", d, err)
	}
	if _, err := db.Migrate(ctx); err != nil {
		db.Close()
		t.Fatalf("migrate %s test database: %v", d, err)
	}
	return db
}

// URL creates an empty database of the dialect and returns its URL: a SQLite
// file path, or the PostgreSQL URL with search_path set to a new schema that
// is dropped when the test ends.
func URL(t testing.TB, d models.Dialect) string {
	t.Helper()
	if d == models.SQLite {
		return filepath.Join(t.TempDir(), "joblib.db")
	}
	base := PostgresURL()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("connect to test PostgreSQL at %s: %v (run: bash scripts/test.sh, which starts it)", base, err)
	}
	defer conn.Close(context.Background())
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "t_" + hex.EncodeToString(b)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("create test schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Errorf("drop test schema %s: %v", schema, err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop test schema %s: %v", schema, err)
		}
	})
	pu, err := url.Parse(base)
	if err != nil {
		t.Fatalf("parse %s: %v", base, err)
	}
	q := pu.Query()
	q.Set("search_path", schema)
	// Commits of a test schema do not wait for their WAL flush. No test
	// survives a PostgreSQL crash, and on a machine whose disk stalls a
	// flush took seconds (CI once timed out a 2 s statement budget on a
	// heartbeat): the timing tests are about joblib, not the disk.
	q.Set("synchronous_commit", "off")
	pu.RawQuery = q.Encode()
	return pu.String()
}

// MigratedURL is URL with joblib's schema already in place: for tests that
// open their own pools on it (several nodes on one schema, event buses).
func MigratedURL(t testing.TB, d models.Dialect) string {
	t.Helper()
	u := URL(t, d)
	openMigrated(t, d, u).Close()
	return u
}

// Node opens another connection pool to the database at url (from URL) with
// its own PostgreSQL event bus, as a second joblib node on the same schema
// has; both are closed at the end of the test.
func Node(t testing.TB, url, name string) (*models.DB, *events.PGBus) {
	t.Helper()
	ctx := context.Background()
	db, err := models.Open(ctx, url, models.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	bus := events.NewPGBus(db.Pool, name, nil)
	if err := bus.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bus.Stop)
	return db, bus
}
