package server

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/zndraw/joblib/joblib"
)

// Every 429 the REST API can answer carries a Retry-After of at least one
// second: each problem code that maps to 429 (rate limits, quotas, the
// @internal share), answered through fail with or without a wait of its
// own, and written directly. A client that retries (the Go SDK) waits for
// it; one that sees none would retry at once.
func TestEvery429HasRetryAfter(t *testing.T) {
	t.Parallel()
	var codes []joblib.Code
	for code, status := range problemStatus {
		if status == http.StatusTooManyRequests {
			codes = append(codes, code)
		}
	}
	if len(codes) < 2 {
		t.Fatalf("429 codes %v: rate-limited and quota-exceeded expected", codes)
	}
	s := &Server{}
	req := httptest.NewRequest("POST", "/v1/joblib/rooms/r/tasks/r:c:n", nil)
	for _, code := range codes {
		for _, wait := range []time.Duration{0, 2500 * time.Millisecond} {
			rec := httptest.NewRecorder()
			s.fail(rec, req, &joblib.Error{Code: code, Detail: "x", RetryAfter: wait})
			n, err := strconv.Atoi(rec.Header().Get("Retry-After"))
			if rec.Code != 429 || err != nil || n < 1 || (wait > 0 && n != 3) {
				t.Fatalf("%s (wait %s): status %d, Retry-After %q", code, wait, rec.Code, rec.Header().Get("Retry-After"))
			}
		}
		rec := httptest.NewRecorder()
		writeProblem(rec, newProblem(code, "x"))
		if rec.Header().Get("Retry-After") == "" {
			t.Fatalf("%s written directly without Retry-After", code)
		}
	}
}
