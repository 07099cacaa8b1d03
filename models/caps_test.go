package models_test

import (
	"testing"

	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// TestCaps: PostgreSQL offers every capability callers switch on (one-
// statement paths, LISTEN, the outbox, state shared between nodes); SQLite,
// one process with one writer, none. Callers outside models ask Caps, never
// the dialect.
func TestCaps(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		pg := db.Dialect() == models.Postgres
		want := models.Caps{HotPath: pg, Listen: pg, Outbox: pg, SharedResultCache: pg, SharedSessions: pg}
		if got := db.Caps(); got != want {
			t.Fatalf("%s: Caps %+v, want %+v", db.Dialect(), got, want)
		}
		if pg != (db.Pool != nil) {
			t.Fatalf("%s: Listen needs the pgx pool, Pool %v", db.Dialect(), db.Pool)
		}
	})
}
