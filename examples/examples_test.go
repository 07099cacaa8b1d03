// Package examples holds a Python worker and a browser page written the
// way a joblib user would write them; the test runs them against a real
// server.
package examples

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
)

// serverEnv is a running joblib (REST and Socket.IO) with two users.
type serverEnv struct {
	url           string
	worker, other string // API tokens
	// sweeps receives the outcome of every sweep (with a sweeper).
	sweeps chan string
}

// liveTimeout is the worker timeout of a server started withSweeper.
const liveTimeout = 2 * time.Second

func startServer(t *testing.T, d models.Dialect, withSweeper bool) serverEnv {
	t.Helper()
	db := dbtest.Open(t, d)
	st := joblib.DefaultSettings()
	if withSweeper {
		st.WorkerTimeout, st.SweeperInterval = liveTimeout, 250*time.Millisecond
	}
	svc := joblib.New(joblib.Config{DB: db, Settings: st})
	if err := svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	sweeps := make(chan string, 1024)
	if withSweeper {
		// Its own lock: parallel tests on the shared PostgreSQL each sweep.
		sw := joblib.NewSweeper(svc, joblib.SweeperConfig{Leader: db.NewLeaderLease("sweeper-"+uuid.NewString(), svc.Node().Run, 10*time.Second)})
		sw.OnSweep(func(ev joblib.SweepEvent) {
			select {
			case sweeps <- ev.Outcome:
			default:
			}
		})
		if err := sw.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(sw.Stop)
	}
	api := server.New(svc, server.DefaultConfig(), nil)
	rcfg := server.DefaultRealtimeConfig()
	rcfg.DisconnectGrace = 500 * time.Millisecond
	rt := api.NewRealtime(rcfg, nil)
	api.Handle("/socket.io/", rt)
	_ = rt.Start(context.Background())
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = rt.Shutdown(ctx)
		srv.Close()
		svc.Close()
	})
	e := serverEnv{url: srv.URL, sweeps: sweeps}
	var err error
	if e.worker, _, err = svc.CreateToken(context.Background(), "worker-owner", false); err != nil {
		t.Fatal(err)
	}
	if e.other, _, err = svc.CreateToken(context.Background(), "submitter", false); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e serverEnv) call(t *testing.T, method, path, token string, body any, hdr ...string) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, e.url+"/v1/joblib"+path, rd)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	for _, h := range hdr {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(k, strings.TrimSpace(v))
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(res.Body).Decode(&m)
	return res.StatusCode, m
}

// process runs a command and streams its stdout lines.
func process(t *testing.T, name string, env []string, args ...string) (*exec.Cmd, <-chan string, *strings.Builder) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
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
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	return cmd, lines, &stderr
}

func expectLine(t *testing.T, lines <-chan string, prefix string, stderr *strings.Builder) string {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("process exited before %q: %s", prefix, stderr.String())
			}
			if rest, ok := strings.CutPrefix(l, prefix); ok {
				return strings.TrimSpace(rest)
			}
		case <-timeout:
			t.Fatalf("no %q within 30s: %s", prefix, stderr.String())
		}
	}
}

// The example worker registers its jobs, stays alive through its socket
// alone (it sends no REST heartbeat while connected) for several worker
// timeouts under a running sweeper, picks up a task submitted by another
// user through task_available, completes it with a result the submitter
// reads back, fails a task whose job raises, and leaves nothing behind on
// SIGTERM.
func TestPythonWorkerExample(t *testing.T) {
	t.Parallel()
	for _, d := range dbtest.Dialects {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			e := startServer(t, d, true)
			cmd, lines, stderr := process(t, "/usr/bin/python3", []string{"JOBLIB_URL=" + e.url, "JOBLIB_TOKEN=" + e.worker, "ROOM=examples", "WORKER_TIMEOUT=2"},
				filepath.Join("python", "worker.py"))
			wid := expectLine(t, lines, "ready ", stderr)

			// The sweeper acts once it has led for one worker timeout; let it
			// sweep for two more: a worker without a fresh heartbeat would
			// be gone.
			acting := time.Time{}
			deadline := time.After(30 * time.Second)
			for acting.IsZero() || time.Since(acting) < 2*liveTimeout {
				select {
				case o := <-e.sweeps:
					if o == joblib.SweepActed {
						t.Fatalf("the sweeper reaped a worker\n%s", stderr)
					}
					if o == joblib.SweepIdle && acting.IsZero() {
						acting = time.Now()
					}
				case <-deadline:
					t.Fatal("the sweeper did not run")
				}
			}
			if st, ws := e.call(t, "GET", "/workers", e.other, nil); st != 200 || ws["total"] != float64(1) {
				t.Fatalf("workers after %s of socket-only liveness: %v", 2*liveTimeout, ws)
			}

			st, jobs := e.call(t, "GET", "/rooms/examples/jobs", e.other, nil)
			if st != 200 || jobs["total"] != float64(3) {
				t.Fatalf("jobs %d %v", st, jobs)
			}
			st, task := e.call(t, "POST", "/rooms/examples/tasks/examples:modifiers:Scale", e.other, map[string]any{"payload": map[string]any{"values": []int{1, 2, 3}, "factor": 2}})
			if st != 202 {
				t.Fatalf("submit %d %v", st, task)
			}
			id := task["id"].(string)
			st, done := e.call(t, "GET", "/tasks/"+id, e.other, nil, "Prefer: wait=20")
			if st != 200 || done["status"] != "completed" || done["worker_id"] != wid {
				t.Fatalf("task %d %v\n%s", st, done, stderr)
			}
			if b, _ := json.Marshal(done["result"]); string(b) != `{"values":[2,4,6]}` {
				t.Fatalf("result %s", b)
			}
			// A job that raises: the task fails with the error, the worker goes on.
			_, task = e.call(t, "POST", "/rooms/examples/tasks/examples:analysis:Summarize", e.other, map[string]any{"payload": map[string]any{"values": []any{1, "x"}}})
			_, failed := e.call(t, "GET", "/tasks/"+task["id"].(string), e.other, nil, "Prefer: wait=20")
			if failed["status"] != "failed" || !strings.HasPrefix(failed["error"].(string), "TypeError") {
				t.Fatalf("raising job: %v", failed)
			}
			_, task = e.call(t, "POST", "/rooms/examples/tasks/examples:analysis:Summarize", e.other, map[string]any{"payload": map[string]any{"values": []int{2, 4}}})
			_, ok := e.call(t, "GET", "/tasks/"+task["id"].(string), e.other, nil, "Prefer: wait=20")
			if b, _ := json.Marshal(ok["result"]); ok["status"] != "completed" || string(b) != `{"count":2,"mean":3,"sum":6}` {
				t.Fatalf("after a failure: %v %s", ok, b)
			}

			// A long task reports its progress; its submitter cancels it, and
			// the worker stops its work at once. It learns it from
			// task_cancelled, or from the refusal of a progress report that
			// was on its way when the cancel committed, whichever reaches
			// it first (server/liveness_test.go holds the event's delivery).
			_, task = e.call(t, "POST", "/rooms/examples/tasks/examples:modifiers:Sleep", e.other, map[string]any{"payload": map[string]any{"steps": 400, "delay": 0.05}})
			id = task["id"].(string)
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				_, cur := e.call(t, "GET", "/tasks/"+id, e.other, nil)
				if p, _ := cur["progress"].(map[string]any); p != nil && p["total"] == float64(400) && cur["status"] == "running" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no progress reported: %v\n%s", cur, stderr)
				}
			}
			sent := time.Now()
			if st, c := e.call(t, "PATCH", "/tasks/"+id, e.other, map[string]any{"status": "cancelled"}); st != 200 || c["status"] != "cancelled" {
				t.Fatalf("cancel %d %v", st, c)
			}
			why := expectLine(t, lines, "cancelled "+id, stderr)
			if byEvent, byRefusal := strings.HasPrefix(why, "cancelled by "), why == "Cannot report progress on a task in status 'cancelled'"; !byEvent && !byRefusal || time.Since(sent) > 5*time.Second {
				t.Fatalf("the worker stopped after %s: %q", time.Since(sent), why)
			}
			// A task past its own timeout: the worker stops, told by the
			// sweeper's task_cancelled or by the refusal of its next progress
			// report, whichever comes first; the sweeper fails the task.
			_, task = e.call(t, "POST", "/rooms/examples/tasks/examples:modifiers:Sleep", e.other, map[string]any{"payload": map[string]any{"steps": 400, "delay": 0.05}, "timeout": 1})
			id = task["id"].(string)
			if why := expectLine(t, lines, "cancelled "+id, stderr); why != "Task timed out: task_timeout of 1s passed since the claim" && !strings.Contains(why, "past its deadline") {
				t.Fatalf("timed-out task: the worker says %q", why)
			}
			if _, tk := e.call(t, "GET", "/tasks/"+id, e.other, nil, "Prefer: wait=10"); tk["status"] != "failed" || tk["task_timeout"] != float64(1) {
				t.Fatalf("timed-out task %v", tk)
			}

			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			expectLine(t, lines, "stopped ", stderr)
			st, ws := e.call(t, "GET", "/workers", e.other, nil)
			if st != 200 || ws["total"] != float64(0) {
				t.Fatalf("workers after SIGTERM: %v", ws)
			}
			if _, jobs = e.call(t, "GET", "/rooms/examples/jobs", e.other, nil); jobs["total"] != float64(0) {
				t.Fatalf("jobs after the only worker left: %v", jobs)
			}
		})
	}
}

// The Go SDK example, built and run as a user would, stays alive through its
// socket alone under a running sweeper, completes a task submitted by another
// user, and deletes its worker on SIGTERM.
func TestGoWorkerExample(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "go-worker")
	if out, err := exec.Command("go", "build", "-o", bin, "./go-worker").CombinedOutput(); err != nil {
		t.Fatalf("build go-worker: %v\n%s", err, out)
	}
	// Without configuration it talks to the server's default address.
	help, _ := exec.Command(bin, "-h").CombinedOutput()
	if !strings.Contains(string(help), `(default "http://localhost:8080")`) {
		t.Fatalf("go-worker -h:\n%s", help)
	}
	for _, d := range dbtest.Dialects {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			e := startServer(t, d, true)
			cmd, lines, stderr := process(t, bin, []string{"JOBLIB_CLIENT_URL=" + e.url, "JOBLIB_CLIENT_TOKEN=" + e.worker}, "-room", "gosdk")
			wid := expectLine(t, lines, "ready ", stderr)
			acting := time.Time{}
			deadline := time.After(30 * time.Second)
			for acting.IsZero() || time.Since(acting) < 2*liveTimeout {
				select {
				case o := <-e.sweeps:
					if o == joblib.SweepActed {
						t.Fatalf("the sweeper reaped a worker\n%s", stderr)
					}
					if o == joblib.SweepIdle && acting.IsZero() {
						acting = time.Now()
					}
				case <-deadline:
					t.Fatal("the sweeper did not run")
				}
			}
			st, task := e.call(t, "POST", "/rooms/gosdk/tasks/gosdk:modifiers:echo", e.other, map[string]any{"payload": map[string]any{"a": 1}})
			if st != 202 {
				t.Fatalf("submit %d %v", st, task)
			}
			st, done := e.call(t, "GET", "/tasks/"+task["id"].(string), e.other, nil, "Prefer: wait=20")
			if b, _ := json.Marshal(done["result"]); st != 200 || done["status"] != "completed" || done["worker_id"] != wid || string(b) != `{"echo":{"a":1}}` {
				t.Fatalf("task %d %v %s\n%s", st, done, b, stderr)
			}
			st, read := e.call(t, "GET", "/rooms/gosdk/providers/gosdk:files:echo?x=1&y=%C3%A4", e.other, nil, "Prefer: wait=20")
			if b, _ := json.Marshal(read); st != 200 || string(b) != `{"params":{"x":"1","y":"ä"}}` {
				t.Fatalf("provider read %d %s\n%s", st, b, stderr)
			}
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			expectLine(t, lines, "stopped", stderr)
			if st, ws := e.call(t, "GET", "/workers", e.other, nil); st != 200 || ws["total"] != float64(0) {
				t.Fatalf("workers after SIGTERM: %v", ws)
			}
		})
	}
}

// The browser page's module, run under Node with the real socket.io-client,
// receives the room's events as a user's page would.
func TestBrowserRoomExample(t *testing.T) {
	t.Parallel()
	html, err := os.ReadFile(filepath.Join("browser", "index.html"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(html), `import { watchRoom } from "./room.js"`) || !strings.Contains(string(html), "watchRoom(io, { url: server, token, room }") {
		t.Fatal("index.html does not use room.js")
	}
	nodeModules, err := filepath.Abs(filepath.Join("..", "server", "testdata", "node", "node_modules"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(nodeModules, "socket.io-client")); err != nil {
		t.Fatalf("socket.io-client not installed (scripts/test.sh runs npm ci): %v", err)
	}
	roomJS, _ := filepath.Abs(filepath.Join("browser", "room.js"))
	e := startServer(t, models.SQLite, false)
	script := `
import { createRequire } from "node:module";
const { io } = createRequire(process.env.NODE_MODULES + "/")("socket.io-client");
const { watchRoom } = await import(process.env.ROOM_JS);
const socket = watchRoom(io, { url: process.env.JOBLIB_URL, token: process.env.TOKEN, room: "examples" },
  (name, payload) => console.log("event " + name + " " + JSON.stringify(payload)),
  (text) => console.log("status " + text));
process.on("SIGTERM", () => { socket.close(); process.exit(0); });
`
	_, lines, stderr := process(t, "node", []string{"NODE_MODULES=" + nodeModules, "ROOM_JS=" + roomJS, "JOBLIB_URL=" + e.url, "TOKEN=" + e.other},
		"--input-type=module", "-e", script)
	if got := expectLine(t, lines, "status ", stderr); got != "joined room examples" {
		t.Fatalf("status %q", got)
	}
	st, job := e.call(t, "PUT", "/rooms/examples/jobs", e.worker, map[string]any{"category": "modifiers", "name": "Scale", "schema": map[string]any{}})
	if st != 201 {
		t.Fatalf("register %d %v", st, job)
	}
	if got := expectLine(t, lines, "event jobs_invalidate", stderr); got != "{}" {
		t.Fatalf("jobs_invalidate %q", got)
	}
	_, task := e.call(t, "POST", "/rooms/examples/tasks/examples:modifiers:Scale", e.other, map[string]any{"payload": map[string]any{}})
	var ev map[string]any
	if err := json.Unmarshal([]byte(expectLine(t, lines, "event task_status_event", stderr)), &ev); err != nil {
		t.Fatal(err)
	}
	if ev["id"] != task["id"] || ev["status"] != "pending" || ev["name"] != "examples:modifiers:Scale" {
		t.Fatalf("task_status_event %v", ev)
	}
	// A wrong token is reported as the page shows it.
	_, lines, stderr = process(t, "node", []string{"NODE_MODULES=" + nodeModules, "ROOM_JS=" + roomJS, "JOBLIB_URL=" + e.url, "TOKEN=wrong"},
		"--input-type=module", "-e", script)
	if got := expectLine(t, lines, "status ", stderr); got != "connect error: Unauthorized" {
		t.Fatalf("wrong token: %q", got)
	}
}
