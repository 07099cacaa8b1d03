package models_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// TestMigrateRefusesNewerSchema: a database a newer joblib migrated is not
// touched by an older binary, which would misread its tables; the error
// names both versions so the operator knows which binary to run.
func TestMigrateRefusesNewerSchema(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		ctx := t.Context()
		if applied, err := db.Migrate(ctx); err != nil || len(applied) != 0 {
			t.Fatalf("second migrate of a current schema: applied %v, %v", applied, err)
		}
		latest := models.LatestSchemaVersion()
		newer := latest + 7
		if err := db.ExecRaw("INSERT INTO schema_migrations (version, name) VALUES (?, 'from the future')", newer); err != nil {
			t.Fatal(err)
		}
		applied, err := db.Migrate(ctx)
		if !errors.Is(err, models.ErrSchemaTooNew) {
			t.Fatalf("Migrate on a schema at %d (binary knows %d): applied %v, err %v; want ErrSchemaTooNew", newer, latest, applied, err)
		}
		for _, v := range []int{newer, latest} {
			if !strings.Contains(err.Error(), fmt.Sprint(v)) {
				t.Errorf("error %q does not name version %d", err, v)
			}
		}
		if v, err := db.SchemaVersion(ctx); err != nil || v != newer {
			t.Fatalf("schema version after the refusal: %d, %v", v, err)
		}
	})
}
