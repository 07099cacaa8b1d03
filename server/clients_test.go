package server_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// The real-client tests drive the server with the unmodified clients our users
// run: socket.io-client (pinned in testdata/node/package-lock.json) and
// Debian's python3-socketio. scripts/test.sh installs both.

func nodeClientDir(t *testing.T) string {
	t.Helper()
	dir, _ := filepath.Abs("testdata/node")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "socket.io-client")); err != nil {
		t.Fatal("socket.io-client is not installed; run: npm ci --prefix server/testdata/node (scripts/test.sh does this)")
	}
	return dir
}

const python = "/usr/bin/python3"

func requirePythonClient(t *testing.T) {
	t.Helper()
	if out, err := exec.Command(python, "-c", "import socketio, requests").CombinedOutput(); err != nil {
		t.Fatalf("python3-socketio is not installed (%v: %s); run: bash scripts/test.sh, which installs it", err, out)
	}
}

func runClient(t *testing.T, env []string, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	if !strings.Contains(string(out), "ok") {
		t.Fatalf("%s did not finish: %s", name, out)
	}
}

func TestNodeClientFlow(t *testing.T) {
	t.Parallel()
	dir := nodeClientDir(t)
	eachRealtime(t, func(t *testing.T, e *env) {
		for _, tr := range []string{"websocket", "default"} {
			runClient(t, []string{"JOBLIB_URL=" + e.url, "WORKER_TOKEN=" + e.alice, "UI_TOKEN=" + e.bob,
				"TRANSPORTS=" + tr, "ROOM=node-" + tr}, "node", filepath.Join(dir, "joblib_flow.mjs"))
		}
	})
}

func TestPythonClientFlow(t *testing.T) {
	t.Parallel()
	requirePythonClient(t)
	eachRealtime(t, func(t *testing.T, e *env) {
		for _, tr := range []string{"websocket", "default"} {
			runClient(t, []string{"JOBLIB_URL=" + e.url, "WORKER_TOKEN=" + e.alice, "UI_TOKEN=" + e.bob,
				"TRANSPORTS=" + tr, "ROOM=py-" + tr}, python, "testdata/python/joblib_flow.py")
		}
	})
}

// pythonProcess runs a testdata/python script with env, waits for its first
// stdout line to start with "ready", and returns the process, that line, and
// the rest of its stdout, line by line (closed when it exits).
func pythonProcess(t *testing.T, script string, env ...string) (*exec.Cmd, string, <-chan string) {
	t.Helper()
	cmd := exec.Command(python, "testdata/python/"+script)
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	select {
	case l, ok := <-lines:
		if !ok || !strings.HasPrefix(l, "ready") {
			t.Fatalf("%s did not become ready: %q %s", script, l, stderr.String())
		}
		return cmd, l, lines
	case <-time.After(20 * time.Second):
		t.Fatalf("%s not ready within 20s: %s", script, stderr.String())
	}
	return nil, "", nil
}

// startWorkerProcess runs testdata/python/joblib_worker.py bound to a worker
// and waits until it has joined.
func startWorkerProcess(t *testing.T, e *env, jobName, workerID string) *exec.Cmd {
	t.Helper()
	cmd, _, _ := pythonProcess(t, "joblib_worker.py", "JOBLIB_URL="+e.url, "TOKEN="+e.alice, "JOB_NAME="+jobName, "WORKER_ID="+workerID)
	return cmd
}

func eachRealtimeGrace(t *testing.T, grace time.Duration, fn func(t *testing.T, e *env)) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		cfg := realtimeCfg()
		cfg.DisconnectGrace = grace
		fn(t, setup(t, db, withRealtime(cfg)))
	})
}

// TestKilledWorkerProcessFailsTask: a worker process holding a claimed task
// gets SIGKILL; a UI in the room receives the task's failure with "Worker
// disconnected" within grace + 1 s.
func TestKilledWorkerProcessFailsTask(t *testing.T) {
	t.Parallel()
	requirePythonClient(t)
	const grace = 500 * time.Millisecond
	eachRealtimeGrace(t, grace, func(t *testing.T, e *env) {
		wid := e.registerJob(e.alice, "kill", "modifiers", "Job")["worker_id"].(string)
		ui := mustDialSIO(t, e.url, e.bob)
		ui.mustCall("join_room", map[string]any{"room_id": "kill"})
		id := e.submit(e.bob, "kill", "kill:modifiers:Job", nil)
		proc := startWorkerProcess(t, e, "kill:modifiers:Job", wid)
		if got := e.claim(e.alice, wid); got["id"] != id {
			t.Fatalf("claim got %v", got)
		}
		if err := proc.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		ev := ui.waitEvent("task_status_event", grace+3*time.Second, func(p map[string]any) bool { return p["status"] == "failed" })
		if ev.Payload["id"] != id || ev.Payload["error"] != "Worker disconnected" {
			t.Fatalf("failure event %v", ev.Payload)
		}
		if lag := ev.At.Sub(killed); lag > grace+time.Second {
			t.Fatalf("failure arrived %s after SIGKILL, want within grace + 1s = %s", lag, grace+time.Second)
		}
	})
}

// TestKilledWorkerReconnectsWithinGrace: the killed process's successor
// re-joins with the same worker id inside the grace window; the worker and its
// claimed task survive the window.
func TestKilledWorkerReconnectsWithinGrace(t *testing.T) {
	t.Parallel()
	requirePythonClient(t)
	const grace = 4 * time.Second
	eachRealtimeGrace(t, grace, func(t *testing.T, e *env) {
		wid := e.registerJob(e.alice, "rejoin", "modifiers", "Job")["worker_id"].(string)
		id := e.submit(e.bob, "rejoin", "rejoin:modifiers:Job", nil)
		proc := startWorkerProcess(t, e, "rejoin:modifiers:Job", wid)
		e.claim(e.alice, wid)
		if err := proc.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		startWorkerProcess(t, e, "rejoin:modifiers:Job", wid)
		if time.Since(killed) >= grace {
			t.Fatalf("successor took %s to re-join, longer than the grace window", time.Since(killed))
		}
		time.Sleep(time.Until(killed.Add(grace + time.Second)))
		if st := e.do(e.alice, "GET", api+"/tasks/"+id, nil).want(200).M()["status"]; st != "claimed" {
			t.Fatalf("task is %v after the successor re-joined within grace, want claimed", st)
		}
		e.do(e.alice, "PATCH", api+"/workers/"+wid, nil).want(200)
	})
}
