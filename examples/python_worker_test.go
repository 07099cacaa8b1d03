package examples

import (
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zndraw/joblib/internal/dbtest"
)

// stopProxy stands between a worker and the server and answers the
// worker's own DELETE /workers/{id} as a troubled server would: 404 at once
// (the worker was already removed) or never.
func stopProxy(t *testing.T, server string, hang bool) string {
	t.Helper()
	target, _ := url.Parse(server)
	rp := httputil.NewSingleHostReverseProxy(target)
	srv := http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete && strings.HasPrefix(r.URL.Path, "/v1/joblib/workers/") {
			if hang {
				<-r.Context().Done()
				return
			}
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"type":"/v1/problems/worker-not-found","title":"Not Found","status":404,"detail":"gone"}`))
			return
		}
		rp.ServeHTTP(w, r)
	})}
	ln := listenLoopback(t)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

// The Python example, as a real process: when the server loses its worker
// (here its owner deletes it behind its back; an operator's delete or a
// sweep look the same), its socket is closed, and the worker registers again
// and serves on as the new worker, as the Go SDK does. On SIGTERM it exits
// within a second whatever the server answers its DELETE: a 404, or nothing.
func TestPythonWorkerRegistersAgainAndStopsPromptly(t *testing.T) {
	t.Parallel()
	for _, d := range dbtest.Dialects {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			e := startServer(t, d, false)
			worker := func(room string, hang bool) (func() (time.Duration, string), <-chan string, *strings.Builder) {
				cmd, lines, stderr := process(t, "/usr/bin/python3", []string{"JOBLIB_CLIENT_URL=" + stopProxy(t, e.url, hang), "JOBLIB_CLIENT_TOKEN=" + e.worker,
					"ROOM=" + room, "WORKER_TIMEOUT=3"}, filepath.Join("python", "worker.py"))
				stop := func() (time.Duration, string) {
					start := time.Now()
					if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
						t.Fatal(err)
					}
					var rest []string
					for l := range lines {
						rest = append(rest, l)
					}
					_ = cmd.Wait()
					return time.Since(start), strings.Join(rest, "\n")
				}
				return stop, lines, stderr
			}
			stopA, lines, stderr := worker("again", false)
			stopB, linesB, stderrB := worker("hang", true)
			w1 := expectLine(t, lines, "ready ", stderr)
			expectLine(t, linesB, "ready ", stderrB)

			if st, _ := e.call(t, "DELETE", "/workers/"+w1, e.worker, nil); st != 200 && st != 204 {
				t.Fatalf("delete the worker: %d", st)
			}
			w2 := expectLine(t, lines, "registered ", stderr)
			if w2 == w1 {
				t.Fatalf("registered again as the same worker %s", w2)
			}
			st, task := e.call(t, "POST", "/rooms/again/tasks/again:modifiers:Scale", e.other, map[string]any{"payload": map[string]any{"values": []int{1}, "factor": 3}})
			if st != 202 {
				t.Fatalf("submit %d %v", st, task)
			}
			st, done := e.call(t, "GET", "/tasks/"+task["id"].(string), e.other, nil, "Prefer: wait=20")
			if st != 200 || done["status"] != "completed" || done["worker_id"] != w2 {
				t.Fatalf("task after registering again: %d %v\n%s", st, done, stderr)
			}

			// The worker's own DELETE answers 404: it says so and stops.
			took, rest := stopA()
			if took > 2*time.Second || !strings.Contains(rest, "stopped "+w2) || !strings.Contains(stderr.String(), "404") {
				t.Fatalf("stop with a 404: %s; output %q\n%s", took, rest, stderr)
			}
			// The DELETE gets no answer at all: it stops anyway (its own
			// deadline is 0.9 s; the bound leaves room for a loaded machine).
			tookB, _ := stopB()
			if tookB > 2*time.Second {
				t.Fatalf("stop without an answer took %s\n%s", tookB, stderrB)
			}
			t.Logf("SIGTERM to exit: %s with a 404, %s without an answer", took, tookB)
		})
	}
}

func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}
