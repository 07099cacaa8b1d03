package sio

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/zndraw/joblib/internal/syncbuf"
)

// A connection refused for its Origin is logged with the origin, so that an
// operator can tell why a browser cannot connect; an allowed one is not.
func TestRefusedOriginIsLogged(t *testing.T) {
	t.Parallel()
	var logs syncbuf.Buffer
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
