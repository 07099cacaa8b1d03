package server_test

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestPythonProviderWorker: a real python-socketio provider worker answers
// provider_request by uploading while 50 readers long-poll the same params;
// every reader gets 200 with the same bytes, and exactly one request reached
// the worker.
func TestPythonProviderWorker(t *testing.T) {
	t.Parallel()
	requirePythonClient(t)
	eachRealtime(t, func(t *testing.T, e *env) {
		cmd := exec.Command(python, "testdata/python/joblib_provider.py")
		cmd.Env = append(os.Environ(), "JOBLIB_URL="+e.url, "TOKEN="+e.alice, "ROOM=prov")
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
		case l := <-lines:
			if !strings.HasPrefix(l, "ready ") {
				t.Fatalf("provider worker: %q %s", l, stderr.String())
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("provider worker not ready: %s", stderr.String())
		}
		e.rec.take()

		const readers = 50
		bodies := make([]string, readers)
		statuses := make([]int, readers)
		var wg sync.WaitGroup
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: readers}}
		for i := range readers {
			wg.Go(func() {
				req, _ := http.NewRequest("GET", e.url+api+"/rooms/prov/providers/prov:filesystem:local?path=/data", nil)
				req.Header.Set("Authorization", "Bearer "+e.bob)
				req.Header.Set("Prefer", "wait=15")
				res, err := client.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				defer res.Body.Close()
				b, _ := io.ReadAll(res.Body)
				statuses[i], bodies[i] = res.StatusCode, string(b)
			})
		}
		wg.Wait()
		want := `[{"name": "file.xyz", "path": "/data", "size": 42}]`
		for i := range readers {
			if statuses[i] != 200 || bodies[i] != want {
				t.Fatalf("reader %d: %d %q, want 200 %q", i, statuses[i], bodies[i], want)
			}
		}
		if n := len(of(e.rec.take(), "provider_request")); n != 1 {
			t.Fatalf("%d provider_request events published, want 1", n)
		}
		served := 0
		for done := false; !done; {
			select {
			case l, ok := <-lines:
				if !ok {
					done = true
				} else if strings.HasPrefix(l, "request ") {
					served++
				} else {
					t.Fatalf("provider worker: %s", l)
				}
			case <-time.After(300 * time.Millisecond):
				done = true
			}
		}
		if served != 1 {
			t.Fatalf("the worker served %d requests, want 1", served)
		}
	})
}
