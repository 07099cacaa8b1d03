package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// joblibBinary builds the command once per test process.
func joblibBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "joblib-bin-")
		if err != nil {
			buildErr = err
			return
		}
		// Readable by every user: a test runs it as nobody.
		if err := os.Chmod(dir, 0o755); err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "joblib")
		// The flags of the Dockerfile's static build (deploy/deploy_test.go
		// runs that one): both builds then share the compile cache.
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", binPath, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// proc is a running `joblib serve`.
type proc struct {
	cmd       *exec.Cmd
	addr      string
	stderr    *syncBuffer
	stdout    *syncBuffer
	done      chan error
	listening chan string
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var listenLine = regexp.MustCompile(`msg=listening addr=(\S+)`)

// startServe runs the binary with env and waits for it to listen.
func startServe(t *testing.T, env ...string) *proc {
	t.Helper()
	p := launchServe(t, env...)
	p.waitListening(t)
	return p
}

// launchServe starts the binary with env without waiting for it.
func launchServe(t *testing.T, env ...string) *proc {
	t.Helper()
	cmd := exec.Command(joblibBinary(t), "serve")
	cmd.Env = append(os.Environ(), append([]string{"JOBLIB_LISTEN_ADDR=127.0.0.1:0"}, env...)...)
	cmd.Dir = t.TempDir()
	return launchCmd(t, cmd)
}

// launchCmd starts cmd, a `joblib serve` (possibly behind a wrapper such as
// unshare), without waiting for it to listen.
func launchCmd(t *testing.T, cmd *exec.Cmd) *proc {
	t.Helper()
	pr, pw := io.Pipe()
	p := &proc{cmd: cmd, stderr: &syncBuffer{}, stdout: &syncBuffer{}, done: make(chan error, 1), listening: make(chan string, 1)}
	cmd.Stderr = io.MultiWriter(pw, p.stderr)
	cmd.Stdout = p.stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- cmd.Wait(); pw.Close() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if m := listenLine.FindStringSubmatch(sc.Text()); m != nil {
				p.listening <- m[1]
				break
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	return p
}

// waitListening waits until the process listens and records its address.
func (p *proc) waitListening(t *testing.T) {
	t.Helper()
	select {
	case p.addr = <-p.listening:
	case err := <-p.done:
		t.Fatalf("joblib serve exited before listening: %v\n%s", err, p.stderr)
	case <-time.After(30 * time.Second):
		t.Fatalf("joblib serve did not listen within 30s\n%s", p.stderr)
	}
}

// base is the REST root of the running server.
func (p *proc) base() string { return "http://" + p.addr + "/v1/joblib" }

// call sends body as JSON and decodes a JSON object answer.
func call(t *testing.T, method, url, token string, body any, hdr ...string) (int, http.Header, map[string]any) {
	t.Helper()
	var raw []byte
	if body != nil {
		raw, _ = json.Marshal(body)
	}
	st, out, h := callRaw(t, method, url, token, raw, hdr...)
	var m map[string]any
	_ = json.Unmarshal(out, &m)
	return st, h, m
}

// callRaw sends body as is and returns the raw answer.
func callRaw(t *testing.T, method, url, token string, body []byte, hdr ...string) (int, []byte, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(method, url, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	for _, h := range hdr {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(k, strings.TrimSpace(v))
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	return res.StatusCode, raw, res.Header
}

// TestServeEndToEnd runs the real binary on a temporary SQLite file with an
// admin token, drives a task through its life over HTTP, and stops the server
// with SIGTERM while a long-poll is in flight: the long-poll is answered and
// the process exits cleanly.
func TestServeEndToEnd(t *testing.T) {
	t.Parallel()
	const token = testAdminToken
	db := filepath.Join(t.TempDir(), "e2e.db")
	p := startServe(t, "JOBLIB_DATABASE_URL="+db, "JOBLIB_ADMIN_TOKEN="+token)
	base := "http://" + p.addr + "/v1/joblib"

	st, _, job := call(t, "PUT", base+"/rooms/@global/jobs", token, map[string]any{"category": "modifiers", "name": "Rotate", "schema": map[string]any{}})
	if st != 201 {
		t.Fatalf("register: %d %v", st, job)
	}
	worker := job["worker_id"].(string)
	st, hdr, task := call(t, "POST", base+"/rooms/room1/tasks/@global:modifiers:Rotate", token, map[string]any{"payload": map[string]any{"angle": 90}})
	if st != 202 || hdr.Get("Location") != "/v1/joblib/tasks/"+task["id"].(string) {
		t.Fatalf("submit: %d %v %v", st, hdr, task)
	}
	id := task["id"].(string)
	st, _, claimed := call(t, "POST", base+"/tasks/claim", token, map[string]any{"worker_id": worker})
	if st != 200 || claimed["task"].(map[string]any)["id"] != id {
		t.Fatalf("claim: %d %v", st, claimed)
	}
	for _, s := range []string{"running", "completed"} {
		if st, _, body := call(t, "PATCH", base+"/tasks/"+id, token, map[string]any{"status": s}); st != 200 {
			t.Fatalf("%s: %d %v", s, st, body)
		}
	}
	st, _, got := call(t, "GET", base+"/tasks/"+id, token, nil)
	if st != 200 || got["status"] != "completed" || got["completed_at"] == nil {
		t.Fatalf("final state: %d %v", st, got)
	}

	// A long-poll on a pending task is in flight when SIGTERM arrives.
	pending := submitFor(t, base, token)
	lp := make(chan int, 1)
	go func() {
		st, _, _ := call(t, "GET", base+"/tasks/"+pending, token, nil, "Prefer: wait=30")
		lp <- st
	}()
	time.Sleep(300 * time.Millisecond)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case st := <-lp:
		if st != 200 {
			t.Fatalf("in-flight long-poll answered %d during shutdown", st)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("in-flight long-poll not answered during shutdown")
	}
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("serve exited with %v\n%s", err, p.stderr)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("serve did not exit after SIGTERM\n%s", p.stderr)
	}
	if !strings.Contains(p.stderr.String(), "msg=stopped") {
		t.Fatalf("no clean stop logged:\n%s", p.stderr)
	}
}

func submitFor(t *testing.T, base, token string) string {
	t.Helper()
	st, _, task := call(t, "POST", base+"/rooms/room1/tasks/@global:modifiers:Rotate", token, map[string]any{"payload": map[string]any{}})
	if st != 202 {
		t.Fatalf("submit: %d %v", st, task)
	}
	return task["id"].(string)
}

// TestServeRejectsBadConfig: an invalid value stops serve at start with a
// message naming the variable.
func TestServeRejectsBadConfig(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(joblibBinary(t), "serve")
	cmd.Env = append(os.Environ(), "JOBLIB_WORKER_TIMEOUT=soon")
	cmd.Dir = t.TempDir()
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("serve accepted JOBLIB_WORKER_TIMEOUT=soon:\n%s", out)
	}
	if !strings.Contains(string(out), "JOBLIB_WORKER_TIMEOUT") {
		t.Fatalf("error does not name the variable:\n%s", out)
	}
}

// TestMain removes the binary joblibBinary built.
func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}
