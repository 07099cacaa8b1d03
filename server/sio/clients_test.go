package sio

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// These tests run the real clients against the server: socket.io-client from npm
// (pinned by server/testdata/node/package-lock.json) and Debian's
// python3-socketio. A missing client is a failure, never a skip.

const nodeDir = "../testdata/node"

func runClient(t *testing.T, ts *testServer, timeout time.Duration, name string, arg ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, arg...)
	cmd.Env = append(os.Environ(), "SIO_URL="+ts.url, "NO_COLOR=1")
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("%s did not finish within %v:\n%s", name, timeout, out)
	}
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, arg, err, out)
	}
	t.Logf("%s output:\n%s", name, out)
}

func TestNodeClient(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat(filepath.Join(nodeDir, "node_modules", "socket.io-client")); err != nil {
		t.Fatal("run: npm ci --prefix server/testdata/node (scripts/test.sh does this)")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is not installed: %v (scripts/test.sh installs it)", err)
	}
	ts := startServer(t, testConfig(), nil)
	tests, err := filepath.Glob(filepath.Join(nodeDir, "*.test.mjs"))
	if err != nil || len(tests) == 0 {
		t.Fatalf("no node tests in %s: %v", nodeDir, err)
	}
	runClient(t, ts, 3*time.Minute, node, append([]string{"--test", "--test-concurrency=1"}, tests...)...)
}

func TestPythonClient(t *testing.T) {
	t.Parallel()
	const python = "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		t.Fatalf("%s is missing (scripts/test.sh installs python3-socketio)", python)
	}
	ts := startServer(t, testConfig(), nil)
	runClient(t, ts, 2*time.Minute, python, "../testdata/python/client_test.py")
}
