package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

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
	for _, p := range procs {
		p.waitListening(t)
	}
	// A node's stdout (the token) and stderr (its logs) reach the test
	// through separate pipes: wait until some token has arrived and every
	// node that logged making one has its token in.
	printed := func() (tokens []string, complete bool) {
		complete = true
		for _, p := range procs {
			m := printedToken.FindStringSubmatch(p.stdout.String())
			if m != nil {
				tokens = append(tokens, m[1])
			} else if strings.Contains(p.stderr.String(), "created the initial admin token") {
				complete = false
			}
		}
		return tokens, complete && len(tokens) > 0
	}
	tokens, complete := printed()
	for deadline := time.Now().Add(10 * time.Second); !complete && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		tokens, complete = printed()
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

// TestServeNodeIdentity: a process refuses to start (non-zero exit, a
// message naming JOBLIB_NODE_ID) while a live process holds its node id;
// processes without JOBLIB_NODE_ID on one host get distinct ids, each with
// a live lease advertising its address.
func TestServeNodeIdentity(t *testing.T) {
	t.Parallel()
	dbURL := dbtest.URL(t, models.Postgres)
	env := []string{"JOBLIB_DATABASE_URL=" + dbURL, "JOBLIB_ADMIN_TOKEN=" + testAdminToken}
	first := startServe(t, append(env, "JOBLIB_NODE_ID=same")...)
	second := launchServe(t, append(env, "JOBLIB_NODE_ID=same")...)
	select {
	case err := <-second.done:
		if err == nil {
			t.Fatalf("second process with the same node id exited cleanly:\n%s", second.stderr)
		}
		if !strings.Contains(second.stderr.String(), `node id "same" is held by another running process`) ||
			!strings.Contains(second.stderr.String(), "JOBLIB_NODE_ID") {
			t.Fatalf("unclear refusal:\n%s", second.stderr)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("second process with the same node id kept running:\n%s", second.stderr)
	}
	a, b := startServe(t, env...), startServe(t, env...)

	db, err := models.Open(t.Context(), dbURL, models.OpenOptions{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	nodes, err := db.Q(t.Context()).ListNodes()
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	addrs := map[string]bool{}
	for _, n := range nodes {
		if !n.Live {
			t.Fatalf("lease of a running node is not live: %+v", n)
		}
		ids[n.NodeID] = true
		addrs[n.Addr] = true
	}
	if len(nodes) != 3 || len(ids) != 3 || !ids["same"] {
		t.Fatalf("leases %+v", nodes)
	}
	for _, p := range []*proc{first, a, b} {
		if !addrs[p.addr] {
			t.Fatalf("no lease advertises %s: %+v", p.addr, nodes)
		}
	}
	if got := metricLines(t, a, "joblib_nodes{"); got != `joblib_nodes{state="lapsed"} 0; joblib_nodes{state="live"} 3` {
		t.Fatalf("node metrics: %s", got)
	}
}
