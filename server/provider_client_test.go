package server_test

import (
	"io"
	"net/http"
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
		_, _, lines := pythonProcess(t, "joblib_provider.py", "JOBLIB_URL="+e.url, "TOKEN="+e.alice, "ROOM=prov")
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
