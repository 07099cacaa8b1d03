package server_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/server"
)

// endpoints lists one request per route of the contract's REST surface,
// against existing rows where that matters.
type endpoint struct {
	method, path string
	body         any
}

func readEndpoints(taskID string) []endpoint {
	return []endpoint{
		{"GET", api + "/workers", nil},
		{"GET", api + "/rooms/room/jobs", nil},
		{"GET", api + "/rooms/room/jobs/" + rotate, nil},
		{"GET", api + "/rooms/room/jobs/" + rotate + "/tasks", nil},
		{"GET", api + "/rooms/room/workers", nil},
		{"GET", api + "/rooms/room/tasks", nil},
		{"GET", api + "/tasks/" + taskID, nil},
	}
}

func writeEndpoints(workerID, taskID string) []endpoint {
	return []endpoint{
		{"POST", api + "/workers", nil},
		{"PATCH", api + "/workers/" + workerID, nil},
		{"DELETE", api + "/workers/" + workerID, nil},
		{"PUT", api + "/rooms/room/jobs", map[string]any{"category": "modifiers", "name": "X"}},
		{"POST", api + "/rooms/room/tasks/" + rotate, map[string]any{"payload": map[string]any{}}},
		{"POST", api + "/tasks/claim", map[string]any{"worker_id": workerID}},
		{"PATCH", api + "/tasks/" + taskID, map[string]any{"status": "cancelled"}},
	}
}

// Every write needs credentials: no token, an unknown token, a malformed
// header all answer 401 as problem+json with a Bearer challenge, and change
// nothing.
func TestWritesRequireAuthentication(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w := e.seed()
		id := e.submit(e.admin, "room", rotate, nil)
		e.emissions()
		for _, ep := range writeEndpoints(w, id) {
			for _, auth := range []string{"", "Authorization: Bearer jl_not-a-token", "Authorization: Bearer not.a.jwt", "Authorization: Basic YTpi"} {
				var hdr []string
				if auth != "" {
					hdr = append(hdr, auth)
				}
				r := e.do("", ep.method, ep.path, ep.body, hdr...)
				p := r.problem(401, "unauthorized")
				if d, _ := p["detail"].(string); d == "" || d == "Unauthorized" || p["title"] != "Unauthorized" {
					t.Fatalf("%s %s: problem %v", ep.method, ep.path, p)
				}
				if r.Header.Get("WWW-Authenticate") == "" {
					t.Fatalf("%s %s: no WWW-Authenticate", ep.method, ep.path)
				}
			}
		}
		if e.total(api+"/workers") != 1 || e.total(api+"/rooms/room/tasks?status=pending") != 1 || e.total(api+"/rooms/room/jobs") != 1 {
			t.Fatal("unauthenticated writes changed state")
		}
		if ems := e.emissions(); len(ems) != 0 {
			t.Fatalf("unauthenticated writes emitted %v", ems)
		}
	})
}

// DESIGN improvement 2: reads need a token by default (401 problem).
func TestReadsRequireAuthenticationByDefault(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		e.seed()
		id := e.submit(e.admin, "room", rotate, nil)
		for _, ep := range readEndpoints(id) {
			e.do("", ep.method, ep.path, nil).problem(401, "unauthorized")
			e.do("", ep.method, ep.path, nil, "Authorization: Bearer jl_wrong").problem(401, "unauthorized")
			e.do(e.bob, ep.method, ep.path, nil).want(200)
		}
	})
}

// PublicReads lets anonymous callers read (the contract's behaviour) while
// writes still need a token.
func TestPublicReads(t *testing.T) {
	t.Parallel()
	opts := []func(*setupOpts){func(o *setupOpts) { o.publicReads = true }}
	eachWith(t, opts, func(t *testing.T, e *env) {
		w := e.seed()
		id := e.submit(e.admin, "room", rotate, nil)
		for _, ep := range readEndpoints(id) {
			e.do("", ep.method, ep.path, nil).want(200)
		}
		if got := e.do("", "GET", api+"/tasks/"+id, nil).want(200).M(); got["id"] != id {
			t.Fatalf("anonymous read %v", got)
		}
		for _, ep := range writeEndpoints(w, id) {
			e.do("", ep.method, ep.path, ep.body).problem(401, "unauthorized")
		}
	})
}

// Unknown paths and methods answer problem+json too.
func TestRoutingErrorsAreProblems(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		e.do(e.alice, "GET", api+"/nope", nil).problem(404, "not-found")
		e.do(e.alice, "PUT", api+"/workers", nil).problem(405, "method-not-allowed")
		e.do(e.alice, "DELETE", api+"/tasks/"+uuid.NewString(), nil).problem(405, "method-not-allowed")
	})
}

// DESIGN improvement 9: a body over MaxBodyBytes answers 413 problem+json on
// every endpoint that reads one, and changes nothing.
func TestOversizedBody(t *testing.T) {
	t.Parallel()
	cfg := server.DefaultConfig()
	cfg.MaxBodyBytes = 256
	opts := []func(*setupOpts){func(o *setupOpts) { o.serverCfg = &cfg }}
	eachWith(t, opts, func(t *testing.T, e *env) {
		w := e.seed()
		id := e.submit(e.admin, "room", rotate, nil)
		if c := e.claim(e.admin, w); c["id"] != id {
			t.Fatalf("claim %v", c)
		}
		pending := e.submit(e.admin, "room", rotate, nil)
		e.emissions()
		big := make([]byte, 1024)
		for i := range big {
			big[i] = 'x'
		}
		pad := string(big)
		reqs := []endpoint{
			{"PUT", api + "/rooms/room/jobs", map[string]any{"category": "modifiers", "name": "Big", "schema": map[string]any{"pad": pad}}},
			{"POST", api + "/rooms/room/tasks/" + rotate, map[string]any{"payload": map[string]any{"pad": pad}}},
			{"POST", api + "/tasks/claim", map[string]any{"worker_id": w, "pad": pad}},
			{"PATCH", api + "/tasks/" + id, map[string]any{"status": "running", "error": pad}},
		}
		for _, r := range reqs {
			p := e.do(e.admin, r.method, r.path, r.body).problem(http.StatusRequestEntityTooLarge, "payload-too-large")
			if p["title"] != "Request Entity Too Large" {
				t.Fatalf("%s %s: problem %v", r.method, r.path, p)
			}
		}
		if got := e.getTask(id); got["status"] != "claimed" || got["error"] != nil {
			t.Fatalf("claimed task changed: %v", got)
		}
		if got := e.getTask(pending); got["status"] != "pending" {
			t.Fatalf("pending task changed: %v", got)
		}
		if e.total(api+"/rooms/room/jobs") != 1 || e.total(api+"/rooms/room/tasks") != 2 || e.total(api+"/workers") != 1 {
			t.Fatal("oversized requests changed state")
		}
		if ems := e.emissions(); len(ems) != 0 {
			t.Fatalf("oversized requests emitted %v", ems)
		}
		// A body under the limit still works.
		e.patch(e.admin, id, "running").want(200)
	})
}

// jwt signs an HS256 token with the given claims.
func jwt(secret string, claims map[string]any, alg string) string {
	enc := base64.RawURLEncoding
	hdr, _ := json.Marshal(map[string]any{"alg": alg, "typ": "JWT"})
	body, _ := json.Marshal(claims)
	msg := enc.EncodeToString(hdr) + "." + enc.EncodeToString(body)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(msg))
	return msg + "." + enc.EncodeToString(mac.Sum(nil))
}

// With JWTSecret set, the host's fastapi-users access tokens (HS256, sub =
// user id, aud fastapi-users:auth) authenticate; the user is created on first
// sight as a regular user. Bad signatures, expired tokens, other audiences,
// other algorithms and non-UUID subjects are 401.
func TestFastAPIUsersJWT(t *testing.T) {
	t.Parallel()
	const secret = "s3cret"
	cfg := server.DefaultConfig()
	cfg.JWTSecret = secret
	opts := []func(*setupOpts){func(o *setupOpts) { o.serverCfg = &cfg }}
	eachWith(t, opts, func(t *testing.T, e *env) {
		sub := uuid.NewString()
		exp := time.Now().Add(time.Hour).Unix()
		good := jwt(secret, map[string]any{"sub": sub, "aud": []string{"fastapi-users:auth"}, "exp": exp}, "HS256")
		w := e.do(good, "POST", api+"/workers", nil).want(201).M()["id"].(string)
		e.do(good, "PATCH", api+"/workers/"+w, nil).want(200)
		// The same subject is the same user; it is not a superuser.
		e.do(jwt(secret, map[string]any{"sub": sub, "aud": "fastapi-users:auth", "exp": exp}, "HS256"), "PATCH", api+"/workers/"+w, nil).want(200)
		e.do(good, "PUT", api+"/rooms/@global/jobs", map[string]any{"category": "modifiers", "name": "X"}).problem(403, "forbidden")
		e.do(jwt(secret, map[string]any{"sub": uuid.NewString(), "aud": "fastapi-users:auth", "exp": exp}, "HS256"), "PATCH", api+"/workers/"+w, nil).problem(403, "forbidden")

		bad := map[string]string{
			"wrong secret":  jwt("other", map[string]any{"sub": sub, "exp": exp}, "HS256"),
			"expired":       jwt(secret, map[string]any{"sub": sub, "exp": time.Now().Add(-time.Minute).Unix()}, "HS256"),
			"not yet valid": jwt(secret, map[string]any{"sub": sub, "nbf": time.Now().Add(time.Hour).Unix()}, "HS256"),
			"audience":      jwt(secret, map[string]any{"sub": sub, "aud": "someone-else"}, "HS256"),
			"algorithm":     jwt(secret, map[string]any{"sub": sub}, "HS512"),
			"subject":       jwt(secret, map[string]any{"sub": "alice"}, "HS256"),
			"garbage":       "a.b.c",
		}
		for name, tok := range bad {
			if r := e.do(tok, "POST", api+"/workers", nil); r.Status != 401 {
				t.Fatalf("%s: %d %s", name, r.Status, r.Body)
			}
		}
		if n := e.total(api + "/workers"); n != 1 {
			t.Fatalf("%d workers", n)
		}
		// API tokens keep working next to JWTs.
		e.do(e.alice, "POST", api+"/workers", nil).want(201)
	})
}
