package sio

import (
	"bytes"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// lockedBuffer is a bytes.Buffer safe for the server's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A connection refused for its Origin is logged with the origin, so that an
// operator can tell why a browser cannot connect; an allowed one is not.
func TestRefusedOriginIsLogged(t *testing.T) {
	t.Parallel()
	var logs lockedBuffer
	cfg := testConfig()
	cfg.OriginPatterns = []string{"app.example.com"}
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	ts := startServer(t, cfg, nil)
	get := func(origin string) int {
		req, _ := http.NewRequest(http.MethodGet, ts.endpoint("EIO=4&transport=polling"), nil)
		req.Header.Set("Origin", origin)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if st := get("http://app.example.com"); st != 200 {
		t.Fatalf("allowed origin: %d", st)
	}
	if strings.Contains(logs.String(), "origin not allowed") {
		t.Fatalf("allowed origin logged as refused:\n%s", logs.String())
	}
	if st := get("http://evil.example.com"); st != http.StatusForbidden {
		t.Fatalf("foreign origin: %d", st)
	}
	if out := logs.String(); !strings.Contains(out, "origin not allowed") || !strings.Contains(out, "origin=http://evil.example.com") {
		t.Fatalf("refusal not logged with its origin:\n%s", out)
	}
}
