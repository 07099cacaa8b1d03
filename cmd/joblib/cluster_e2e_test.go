package main

import (
	"regexp"
	"testing"

	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

var printedToken = regexp.MustCompile(`(?m)^(jl_\S+)$`)

// TestServeConcurrentStartEmptyDatabase: several `joblib serve` processes
// started at the same moment on an empty PostgreSQL schema all come up
// (migrations, the spill table and the first admin are made once, under one
// advisory lock), exactly one of them creates and prints the first admin
// token, and that token works on every node.
func TestServeConcurrentStartEmptyDatabase(t *testing.T) {
	t.Parallel()
	dbURL := dbtest.URL(t, models.Postgres)
	const n = 4
	procs := make([]*proc, n)
	for i := range procs {
		procs[i] = launchServe(t, "JOBLIB_DATABASE_URL="+dbURL)
	}
	var tokens []string
	for _, p := range procs {
		p.waitListening(t)
		if m := printedToken.FindStringSubmatch(p.stdout.String()); m != nil {
			tokens = append(tokens, m[1])
		}
	}
	if len(tokens) != 1 {
		t.Fatalf("%d nodes printed a first admin token, want exactly 1: %q", len(tokens), tokens)
	}
	for _, p := range procs {
		if st, body, _ := callRaw(t, "GET", p.base()+"/workers", tokens[0], nil); st != 200 {
			t.Fatalf("node %s refused the first admin token: %d %s", p.addr, st, body)
		}
	}
}
