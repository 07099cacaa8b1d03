package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
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
			if strings.Contains(string(r.Body), `\u003c`) {
				t.Errorf("%q: the problem escapes < as HTML: %s", c.header, r.Body)
			}
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

// A worker removed while its socket is open loses that socket, so that its
// client learns it must register again: at once when this node removed it
// (a DELETE, an operator, the sweeper), within a keep-alive interval when
// another node or process did. Other sockets stay.
func TestRemovedWorkerSocketIsClosed(t *testing.T) {
	t.Parallel()
	eachRealtime(t, func(t *testing.T, e *env) {
		bind := func(name string) (string, *sioClient) {
			t.Helper()
			wid := e.registerJob(e.alice, "rm", "modifiers", name)["worker_id"].(string)
			c := mustDialSIO(t, e.url, e.alice)
			c.mustCall("join_job_room", map[string]any{"job_name": "rm:modifiers:" + name, "worker_id": wid})
			return wid, c
		}
		closed := func(c *sioClient, within time.Duration) bool {
			select {
			case <-c.done:
				return true
			case <-time.After(within):
				return false
			}
		}
		here, cHere := bind("A")
		elsewhere, cElsewhere := bind("B")
		_, cKept := bind("C")

		e.do(e.alice, "DELETE", api+"/workers/"+here, nil).want(204)
		if !closed(cHere, 2*time.Second) {
			t.Fatal("the socket of a worker deleted on this node stayed open")
		}
		// Another process on the same database removes the other worker.
		other := joblib.New(joblib.Config{DB: e.db})
		defer other.Close()
		if _, err := other.OperatorDeleteWorker(context.Background(), uuid.MustParse(elsewhere), "cli:test"); err != nil {
			t.Fatal(err)
		}
		if !closed(cElsewhere, 3*time.Second) {
			t.Fatal("the socket of a worker removed by another process stayed open past the keep-alive")
		}
		if closed(cKept, 300*time.Millisecond) {
			t.Fatal("an unrelated worker's socket was closed")
		}
	})
}

// POST /dashboard/sweep: superusers only; a threshold below twice the
// socket keep-alive is refused with the reason; otherwise the stale workers
// are cleaned with path operator, their owners named.
func TestDashboardSweep(t *testing.T) {
	t.Parallel()
	eachRealtime(t, func(t *testing.T, e *env) {
		stale := e.newWorker(e.alice)
		if err := e.db.Q(context.Background()).SetHeartbeatAge([]uuid.UUID{uuid.MustParse(stale)}, time.Minute); err != nil {
			t.Fatal(err)
		}
		e.do(e.alice, "POST", api+"/dashboard/sweep", map[string]any{}).problem(403, "forbidden")
		m := e.do(e.admin, "POST", api+"/dashboard/sweep", map[string]any{"threshold_seconds": 0.15}).problem(422, "validation-error")
		if d, _ := m["detail"].(string); !strings.Contains(d, "below twice the socket keep-alive interval (100ms)") {
			t.Fatalf("detail %q", d)
		}
		e.do(e.admin, "POST", api+"/dashboard/sweep", map[string]any{"threshold_seconds": -1}).problem(422, "validation-error")
		v := e.do(e.admin, "POST", api+"/dashboard/sweep", map[string]any{"threshold_seconds": 30}).want(200).M()
		ws, _ := v["workers"].([]any)
		if v["dry_run"] != false || len(ws) != 1 || ws[0].(map[string]any)["id"] != stale || ws[0].(map[string]any)["user_name"] != "alice" {
			t.Fatalf("sweep answered %v", v)
		}
		e.do(e.alice, "PATCH", api+"/workers/"+stale, nil).problem(404, "worker-not-found")
	})
}
