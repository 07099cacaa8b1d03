package server_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMain doubles as the worker program of the process tests: started with
// JOBLIB_TESTWORKER_URL set, the test binary is a REST-only worker instead.
func TestMain(m *testing.M) {
	if os.Getenv("JOBLIB_TESTWORKER_URL") != "" {
		os.Exit(testWorkerMain())
	}
	code := m.Run()
	if n := apiClient.Transport.(*contractTransport).validated.Load(); n > 0 {
		line := fmt.Sprintf("openapi: %d answers validated against server/openapi.json", n)
		fmt.Println(line)
		// scripts/test.sh prints it after the run.
		if f := os.Getenv("JOBLIB_OPENAPI_REPORT"); f != "" {
			_ = os.WriteFile(f, []byte(line+"\n"), 0o644)
		}
	}
	os.Exit(code)
}

// testWorkerMain registers a worker and a job, claims one task (unless
// JOBLIB_TESTWORKER_CLAIM=0), starts it, then heartbeats every
// JOBLIB_TESTWORKER_HEARTBEAT until a heartbeat is refused. It reports on
// stdout: "registered <worker>", "claimed <task>", "heartbeat <status>".
// JOBLIB_TESTWORKER_BURN=N keeps N goroutines spinning on the CPU.
func testWorkerMain() int {
	base, token := os.Getenv("JOBLIB_TESTWORKER_URL"), os.Getenv("JOBLIB_TESTWORKER_TOKEN")
	every, err := time.ParseDuration(os.Getenv("JOBLIB_TESTWORKER_HEARTBEAT"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "heartbeat:", err)
		return 2
	}
	if n, _ := strconv.Atoi(os.Getenv("JOBLIB_TESTWORKER_BURN")); n > 0 {
		for range n {
			go func() {
				x := 0
				for {
					x++
				}
			}()
		}
	}
	call := func(method, path string, body any) (int, map[string]any) {
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, _ := http.NewRequest(method, base+"/v1/joblib"+path, rd)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, nil
		}
		defer res.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(res.Body).Decode(&m)
		return res.StatusCode, m
	}
	code, w := call("POST", "/workers", nil)
	if code != 201 {
		fmt.Fprintln(os.Stderr, "create worker:", code)
		return 2
	}
	id := w["id"].(string)
	job := map[string]any{"category": "modifiers", "name": os.Getenv("JOBLIB_TESTWORKER_JOB"), "schema": map[string]any{}, "worker_id": id}
	if p := os.Getenv("JOBLIB_TESTWORKER_POLICY"); p != "" {
		job["on_worker_loss"] = p
	}
	if code, _ := call("PUT", "/rooms/r/jobs", job); code != 201 && code != 200 {
		fmt.Fprintln(os.Stderr, "register job:", code)
		return 2
	}
	fmt.Printf("registered %s\n", id)
	if os.Getenv("JOBLIB_TESTWORKER_CLAIM") != "0" {
		for {
			code, m := call("POST", "/tasks/claim", map[string]any{"worker_id": id})
			if code != 200 {
				fmt.Fprintln(os.Stderr, "claim:", code)
				return 2
			}
			if t, ok := m["task"].(map[string]any); ok {
				tid := t["id"].(string)
				if code, _ := call("PATCH", "/tasks/"+tid, map[string]any{"status": "running"}); code != 200 {
					fmt.Fprintln(os.Stderr, "start:", code)
					return 2
				}
				fmt.Printf("claimed %s\n", tid)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for {
		time.Sleep(every)
		if code, _ := call("PATCH", "/workers/"+id, nil); code != 200 {
			fmt.Printf("heartbeat %d\n", code)
			return 3
		}
	}
}

// workerProc is a running test worker.
type workerProc struct {
	cmd   *exec.Cmd
	lines chan string
	done  chan struct{}
}

func startWorker(t *testing.T, url, token, job, policy string, heartbeat time.Duration, claim bool, burn int) *workerProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		"JOBLIB_TESTWORKER_URL="+url, "JOBLIB_TESTWORKER_TOKEN="+token, "JOBLIB_TESTWORKER_JOB="+job,
		"JOBLIB_TESTWORKER_POLICY="+policy, "JOBLIB_TESTWORKER_HEARTBEAT="+heartbeat.String(),
		"JOBLIB_TESTWORKER_CLAIM="+map[bool]string{true: "1", false: "0"}[claim],
		"JOBLIB_TESTWORKER_BURN="+strconv.Itoa(burn), "GOMAXPROCS="+strconv.Itoa(runtime.NumCPU()))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &workerProc{cmd: cmd, lines: make(chan string, 16), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	return p
}

// expect waits for a line with the prefix and returns its argument.
func (p *workerProc) expect(t *testing.T, prefix string, within time.Duration) string {
	t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("worker exited before %q", prefix)
			}
			if rest, ok := strings.CutPrefix(l, prefix+" "); ok {
				return rest
			}
			t.Fatalf("worker said %q, want %q", l, prefix)
		case <-timer.C:
			t.Fatalf("worker did not say %q within %s", prefix, within)
		}
	}
}
