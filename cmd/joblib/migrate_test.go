package main

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zndraw/joblib/models"
	_ "modernc.org/sqlite" // the driver, to write a row joblib never would
)

// TestNewerSchemaRefused: `joblib migrate` and `joblib serve` both stop on a
// database a newer joblib migrated, exit 1, name both schema versions, and
// leave the database as it was (serve never starts serving).
func TestNewerSchemaRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "joblib.db")
	env := []string{"JOBLIB_DATABASE_URL=" + file, "JOBLIB_LISTEN_ADDR=127.0.0.1:0"}
	if code, out, errOut := runBin(t, dir, env, "migrate"); code != 0 {
		t.Fatalf("migrate: exit %d\n%s\n%s", code, out, errOut)
	}
	latest := models.LatestSchemaVersion()
	newer := latest + 1
	raw, err := sql.Open("sqlite", file)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.ExecContext(context.Background(), "INSERT INTO schema_migrations (version, name) VALUES (?, 'from a newer joblib')", newer); err != nil {
		t.Fatal(err)
	}
	raw.Close()
	for _, cmd := range []string{"migrate", "serve"} {
		code, out, errOut := runBin(t, dir, env, cmd)
		if code != 1 || strings.Contains(out, "schema at version") {
			t.Fatalf("%s on a newer schema: exit %d\n%s\n%s", cmd, code, out, errOut)
		}
		for _, want := range []string{fmt.Sprintf("version %d", newer), fmt.Sprintf("up to %d", latest)} {
			if !strings.Contains(errOut, want) {
				t.Errorf("%s: stderr does not say %q:\n%s", cmd, want, errOut)
			}
		}
	}
}
