package server

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/zndraw/joblib/joblib"
)

// TestForwardedCallAfterLeaseLossIsRefused: a call another node forwarded
// here, read only after this node found its lease lapsed (it was frozen,
// and the forwarding node has answered 503 meanwhile), is refused without
// running; while the lease holds it runs.
func TestForwardedCallAfterLeaseLossIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lease error // what AwaitNodeLease returns
		runs  bool
	}{
		{"lease held", nil, true},
		{"lease lost", joblib.ErrNodeLeaseLost, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var refused error
			h := &homeRouter{
				await: func(context.Context) error { return tc.lease },
				fail: func(w http.ResponseWriter, _ *http.Request, err error) {
					refused = err
					w.WriteHeader(http.StatusServiceUnavailable)
				},
			}
			ran := false
			r := httptest.NewRequest("POST", prefix+"/tasks/claim", strings.NewReader(`{}`))
			r.Header.Set(forwardedHeader, "1")
			h.route(func(http.ResponseWriter, *http.Request) { ran = true })(httptest.NewRecorder(), r)
			if ran != tc.runs {
				t.Errorf("ran %t, want %t", ran, tc.runs)
			}
			if !tc.runs && !errors.Is(refused, errHomeNodeUnavailable) {
				t.Errorf("refused with %v, want errHomeNodeUnavailable", refused)
			}
		})
	}
}
