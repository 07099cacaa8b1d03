package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/zndraw/joblib/joblib"
)

// A wrong method answers 405 problem+json with the allowed methods in
// Allow, also where the path looks like a wildcard route's (GET
// /tasks/claim is not a task id).
func TestWrongMethodAnswers405WithAllow(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		for _, c := range []struct{ method, path, allow string }{
			{"GET", api + "/tasks/claim", "POST"},
			{"PATCH", api + "/tasks/claim", "POST"},
			{"DELETE", api + "/tasks/claim-batch", "POST"},
			{"GET", api + "/tasks/update-batch", "POST"},
			{"DELETE", api + "/workers", "GET, HEAD, POST"},
			{"GET", api + "/dashboard/sweep", "POST"},
		} {
			r := e.do(e.admin, c.method, c.path, nil)
			m := r.problem(405, "method-not-allowed")
			if got := r.Header.Get("Allow"); got != c.allow {
				t.Errorf("%s %s: Allow %q, want %q", c.method, c.path, got, c.allow)
			}
			if d, _ := m["detail"].(string); !strings.Contains(d, c.allow) {
				t.Errorf("%s %s: detail %q does not name the allowed methods", c.method, c.path, d)
			}
		}
		// The right method still works.
		w := e.newWorker(e.alice)
		e.do(e.alice, "POST", api+"/tasks/claim", map[string]any{"worker_id": w}).want(200)
	})
}

// A 401 says why: no credentials, a malformed header, a token nobody
// issued, a revoked or an expired one (status and type as the contract).
func TestUnauthorizedSaysWhy(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		revoked, id, _, err := e.svc.IssueToken(ctx, joblib.TokenRequest{User: "carol"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.svc.RevokeToken(ctx, id, "test"); err != nil {
			t.Fatal(err)
		}
		expired, _, _, err := e.svc.IssueToken(ctx, joblib.TokenRequest{User: "carol", TTL: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		for _, c := range []struct{ header, want string }{
			{"", "No credentials: send the header \"Authorization: Bearer <token>\""},
			{"Authorization: Basic YTpi", "Malformed Authorization header: expected \"Bearer <token>\""},
			{"Authorization: jl_sometoken", "Malformed Authorization header"},
			{"Authorization: Bearer jl_not-a-token", "Unknown token"},
			{"Authorization: Bearer " + revoked, "Token revoked"},
			{"Authorization: Bearer " + expired, "Token expired"},
		} {
			var hdr []string
			if c.header != "" {
				hdr = append(hdr, c.header)
			}
			r := e.do("", "POST", api+"/workers", nil, hdr...)
			m := r.problem(401, "unauthorized")
			if d, _ := m["detail"].(string); !strings.HasPrefix(d, c.want) {
				t.Errorf("%q: detail %q, want %q", c.header, d, c.want)
			}
			if r.Header.Get("WWW-Authenticate") == "" {
				t.Errorf("%q: no WWW-Authenticate", c.header)
			}
		}
	})
}

// The root sends a browser to the dashboard.
func TestRootRedirectsToDashboard(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		res, err := c.Get(e.url + "/")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusFound || res.Header.Get("Location") != "/ui/" {
			t.Fatalf("GET /: %d Location %q", res.StatusCode, res.Header.Get("Location"))
		}
		e.do("", "GET", "/nope", nil).problem(404, "not-found")
	})
}
