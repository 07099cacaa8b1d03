package main

import (
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

var metricsLine = regexp.MustCompile(`msg="metrics listening" addr=(\S+)`)

// /metrics can be fenced off: with JOBLIB_METRICS_ADDR it is served only on
// that listener (the public one answers 404), and with JOBLIB_METRICS_TOKEN
// only to callers with that bearer token (401 otherwise).
func TestServeMetricsFenced(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "m.db")
	p := startServe(t, "JOBLIB_DATABASE_URL="+db, "JOBLIB_ADMIN_TOKEN="+testAdminToken, "JOBLIB_METRICS_ADDR=127.0.0.1:0", "JOBLIB_METRICS_TOKEN=s3cret")
	var maddr string
	deadline := time.Now().Add(10 * time.Second)
	for maddr == "" {
		if m := metricsLine.FindStringSubmatch(p.stderr.String()); m != nil {
			maddr = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("no metrics listener logged:\n%s", p.stderr)
		} else {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if st, _, _ := callRaw(t, "GET", "http://"+p.addr+"/metrics", "s3cret", nil); st != http.StatusNotFound {
		t.Fatalf("public /metrics: %d, want 404", st)
	}
	if st, _, h := callRaw(t, "GET", "http://"+maddr+"/metrics", "wrong", nil); st != http.StatusUnauthorized || h.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("metrics with a wrong token: %d %s", st, h.Get("Content-Type"))
	}
	st, body, _ := callRaw(t, "GET", "http://"+maddr+"/metrics", "s3cret", nil)
	if st != http.StatusOK || !strings.Contains(string(body), `joblib_tasks{status="pending"} 0`) ||
		!strings.Contains(string(body), `joblib_limit_rejections_total{limit="json_depth"} 0`) {
		t.Fatalf("metrics: %d\n%s", st, body)
	}
}
