package models

import (
	"strings"
	"testing"
	"testing/fstest"
)

// TestMigrationFiles: every version has a file per dialect with the same
// name and a down note; versions are unique and ascending. The embedded set
// loads at start, so a malformed file would stop every joblib binary.
func TestMigrationFiles(t *testing.T) {
	ms, err := loadMigrations(migrationFS)
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range ms {
		if i > 0 && m.version <= ms[i-1].version {
			t.Fatalf("version %d after %d", m.version, ms[i-1].version)
		}
		if m.down == "" || m.name == "" {
			t.Errorf("migration %d: name %q, down %q", m.version, m.name, m.down)
		}
	}
	if LatestSchemaVersion() != ms[len(ms)-1].version {
		t.Fatalf("LatestSchemaVersion %d, files up to %d", LatestSchemaVersion(), ms[len(ms)-1].version)
	}
}

// TestMigrationFileRules: the loader refuses the mistakes a new migration
// can make, naming the file.
func TestMigrationFileRules(t *testing.T) {
	const good = "-- name: n\n-- down: DROP TABLE x\nCREATE TABLE x (a int);\n"
	cases := map[string]struct {
		files fstest.MapFS
		want  string
	}{
		"one dialect only": {fstest.MapFS{"migrations/0001_a.postgres.sql": {Data: []byte(good)}}, "only"},
		"no down note": {fstest.MapFS{
			"migrations/0001_a.postgres.sql": {Data: []byte(good)},
			"migrations/0001_a.sqlite.sql":   {Data: []byte("-- name: n\nCREATE TABLE x (a int);\n")},
		}, "0001_a.sqlite.sql: no \"-- down:\""},
		"names differ": {fstest.MapFS{
			"migrations/0001_a.postgres.sql": {Data: []byte(good)},
			"migrations/0001_a.sqlite.sql":   {Data: []byte(strings.Replace(good, "name: n", "name: m", 1))},
		}, "name it"},
		"version twice": {fstest.MapFS{
			"migrations/0001_a.postgres.sql": {Data: []byte(good)},
			"migrations/0001_b.postgres.sql": {Data: []byte(good)},
			"migrations/0001_a.sqlite.sql":   {Data: []byte(good)},
		}, "two postgres files"},
		"unknown dialect": {fstest.MapFS{"migrations/0001_a.mysql.sql": {Data: []byte(good)}}, "neither"},
		"short version":   {fstest.MapFS{"migrations/12_a.sqlite.sql": {Data: []byte(good)}}, "four-digit"},
		"open block": {fstest.MapFS{
			"migrations/0001_a.postgres.sql": {Data: []byte(good + "-- statement begin\nCREATE FUNCTION f() ...;\n")},
		}, "statement end"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := loadMigrations(c.files)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
}

// TestParseMigrationStatements: semicolons split statements, comments go,
// and a block keeps a body with semicolons of its own in one statement.
func TestParseMigrationStatements(t *testing.T) {
	name, down, stmts, err := parseMigration(`-- name: counts
-- down: DROP TRIGGER t;
--   then DROP TABLE c
--
-- why it exists
CREATE TABLE c (n int);
  -- an indented comment line goes too
CREATE INDEX c_idx ON c (n);

-- statement begin
CREATE TRIGGER t AFTER INSERT ON c BEGIN
	UPDATE c SET n = n + 1;
END;
-- statement end
DROP INDEX c_idx;
`)
	if err != nil {
		t.Fatal(err)
	}
	if name != "counts" || down != "DROP TRIGGER t; then DROP TABLE c" {
		t.Fatalf("name %q down %q", name, down)
	}
	want := []string{
		"CREATE TABLE c (n int)",
		"CREATE INDEX c_idx ON c (n)",
		"CREATE TRIGGER t AFTER INSERT ON c BEGIN\n\tUPDATE c SET n = n + 1;\nEND",
		"DROP INDEX c_idx",
	}
	if strings.Join(stmts, "|") != strings.Join(want, "|") {
		t.Fatalf("statements\n%q\nwant\n%q", stmts, want)
	}
}
