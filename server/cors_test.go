package server_test

import (
	"testing"

	"github.com/zndraw/joblib/server"
)

// The REST API's CORS: an allowed origin's preflight is answered with the
// origin, methods, headers and max age; its answers (problems included)
// expose what a UI reads; another origin gets no allow headers; credentials
// mode is never allowed.
func TestRESTCORS(t *testing.T) {
	t.Parallel()
	cfg := server.DefaultConfig()
	cfg.AllowedOrigins = []string{"*.example.com"}
	const ui = "https://app.example.com"
	eachWith(t, []func(*setupOpts){withServer(cfg)}, func(t *testing.T, e *env) {
		pre := e.do("", "OPTIONS", api+"/rooms/r/jobs", nil, "Origin: "+ui,
			"Access-Control-Request-Method: GET", "Access-Control-Request-Headers: authorization").want(204)
		for k, want := range map[string]string{
			"Access-Control-Allow-Origin":      ui,
			"Access-Control-Allow-Methods":     "GET, HEAD, POST, PUT, PATCH, DELETE",
			"Access-Control-Allow-Headers":     "Authorization, Content-Type, Idempotency-Key, Prefer",
			"Access-Control-Max-Age":           "600",
			"Vary":                             "Origin",
			"Access-Control-Allow-Credentials": "",
		} {
			if got := pre.Header.Get(k); got != want {
				t.Errorf("preflight %s = %q, want %q", k, got, want)
			}
		}

		e.registerJob(e.alice, "r", "modifiers", "Rotate")
		sub := e.do(e.alice, "POST", api+"/rooms/r/tasks/r:modifiers:Rotate", map[string]any{}, "Origin: "+ui).want(202)
		miss := e.do(e.alice, "GET", api+"/rooms/r/jobs/r:modifiers:Nope", nil, "Origin: "+ui)
		miss.problem(404, "job-not-found")
		for _, r := range []resp{sub, miss} {
			if r.Header.Get("Access-Control-Allow-Origin") != ui || r.Header.Get("Vary") != "Origin" ||
				r.Header.Get("Access-Control-Expose-Headers") != "Location, Retry-After, Preference-Applied, Idempotent-Replayed" ||
				r.Header.Get("Access-Control-Allow-Credentials") != "" {
				t.Errorf("answer %d lacks CORS headers: %v", r.Status, r.Header)
			}
		}

		// Another origin: its preflight is refused with no allow headers,
		// and its requests' answers carry none either.
		bad := e.do("", "OPTIONS", api+"/rooms/r/jobs", nil, "Origin: https://evil.test", "Access-Control-Request-Method: GET")
		bad.problem(403, "forbidden")
		got := e.do(e.alice, "GET", api+"/rooms/r/jobs", nil, "Origin: https://evil.test").want(200)
		for _, r := range []resp{bad, got} {
			for _, k := range []string{"Access-Control-Allow-Origin", "Access-Control-Allow-Methods", "Access-Control-Allow-Headers", "Access-Control-Expose-Headers"} {
				if v := r.Header.Get(k); v != "" {
					t.Errorf("disallowed origin got %s: %q", k, v)
				}
			}
		}
		// "null" (sandboxed frames, file:) is never an allowed origin.
		e.do("", "OPTIONS", api+"/rooms/r/jobs", nil, "Origin: null", "Access-Control-Request-Method: GET").problem(403, "forbidden")
		// A plain OPTIONS (no preflight) is what it was: 405.
		e.do("", "OPTIONS", api+"/rooms/r/jobs", nil).problem(405, "method-not-allowed")
		// Cookie-authenticated cross-origin writes stay refused for an
		// origin not allowed (see csrf.go); an allowed one still needs JSON.
		e.do("", "POST", api+"/rooms/r/tasks/r:modifiers:Rotate", "{}", "Cookie: joblib_token="+e.alice,
			"Origin: https://evil.test", "Content-Type: application/json").problem(403, "forbidden")
		e.do("", "POST", api+"/rooms/r/tasks/r:modifiers:Rotate", "{}", "Cookie: joblib_token="+e.alice,
			"Origin: "+ui, "Content-Type: text/plain").problem(403, "forbidden")
	})
}
