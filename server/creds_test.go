package server_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha512"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
)

func withServer(cfg server.Config) func(*setupOpts) {
	return func(o *setupOpts) { o.serverCfg = &cfg }
}

// detail answers the problem's detail of a 401.
func unauthorized(t *testing.T, r resp) string {
	t.Helper()
	d, _ := r.problem(401, "unauthorized")["detail"].(string)
	return d
}

// A token issued with a TTL works until it expires and is then refused with
// the reason; a revoked token is refused on a node that never saw it at
// once, and on a node that cached it within the credential cache time; the
// last use is recorded.
func TestTokenExpiryRevocationAndLastUse(t *testing.T) {
	t.Parallel()
	cfg := server.DefaultConfig()
	cfg.CredentialCacheTTL = 200 * time.Millisecond
	eachWith(t, []func(*setupOpts){withServer(cfg)}, func(t *testing.T, e *env) {
		ctx := context.Background()
		short, _, _, err := e.svc.IssueToken(ctx, joblib.TokenRequest{User: "carol", TTL: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		long, longID, _, err := e.svc.IssueToken(ctx, joblib.TokenRequest{User: "carol", TTL: 720 * time.Hour, Actor: "test"})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // the database clock passes the 1 ms expiry
		if d := unauthorized(t, e.do(short, "POST", api+"/workers", nil)); d != "Token expired" {
			t.Fatalf("expired token: detail %q", d)
		}
		e.do(long, "POST", api+"/workers", nil).want(201)

		ts, err := e.svc.ListTokens(ctx, "carol")
		if err != nil || len(ts) != 2 {
			t.Fatalf("list %v %+v", err, ts)
		}
		byID := map[uuid.UUID]joblib.TokenInfo{}
		for _, ti := range ts {
			byID[ti.ID] = ti
		}
		lt := byID[longID]
		if lt.User != "carol" || lt.ExpiresAt == nil || lt.LastUsed == nil || lt.RevokedAt != nil {
			t.Fatalf("long token %+v", lt)
		}
		if d := lt.ExpiresAt.Sub(lt.CreatedAt); d < 719*time.Hour || d > 721*time.Hour {
			t.Fatalf("expiry %s after creation", d)
		}
		// A second node over the same database (no cache) within the
		// minute does not rewrite last use.
		other := server.New(e.svc, cfg, nil)
		srv2 := httptest.NewServer(other.Handler())
		defer srv2.Close()
		e2 := *e
		e2.url = srv2.URL
		e2.do(long, "GET", api+"/workers", nil).want(200)
		ts, _ = e.svc.ListTokens(ctx, "carol")
		for _, ti := range ts {
			if ti.ID == longID && !ti.LastUsed.Equal(*lt.LastUsed) {
				t.Fatalf("last use rewritten within a minute: %s -> %s", lt.LastUsed, ti.LastUsed)
			}
		}

		// Revoke while both nodes have it cached.
		if _, err := e.svc.RevokeToken(ctx, longID, "cli:test"); err != nil {
			t.Fatal(err)
		}
		fresh := server.New(e.svc, cfg, nil)
		srv3 := httptest.NewServer(fresh.Handler())
		defer srv3.Close()
		e3 := *e
		e3.url = srv3.URL
		if d := unauthorized(t, e3.do(long, "GET", api+"/workers", nil)); d != "Token revoked" {
			t.Fatalf("revoked token on a fresh node: %q", d)
		}
		waitFor(t, 10*time.Second, func() bool { return e.do(long, "GET", api+"/workers", nil).Status == 401 })
		if _, err := e.svc.RevokeToken(ctx, longID, "cli:test"); err == nil || !strings.Contains(err.Error(), "already revoked") {
			t.Fatalf("second revoke: %v", err)
		}
		// --user revokes every live token of the user; others keep working.
		a2, _, _ := e.svc.CreateToken(ctx, "alice", false)
		ids, err := e.svc.RevokeUserTokens(ctx, "alice", "cli:test")
		if err != nil || len(ids) != 2 {
			t.Fatalf("revoke alice: %v %v", ids, err)
		}
		e3.do(e.alice, "GET", api+"/workers", nil).want(401)
		e3.do(a2, "GET", api+"/workers", nil).want(401)
		e3.do(e.bob, "GET", api+"/workers", nil).want(200)

		al, err := e.svc.ListAudit(ctx, joblib.AuditTokenRevoke, 10)
		if err != nil || len(al) != 3 || al[2].Actor != "cli:test" || *al[2].SubjectID != longID {
			t.Fatalf("audit %v %+v", err, al)
		}
		if al, _ := e.svc.ListAudit(ctx, joblib.AuditTokenCreate, 10); len(al) != 1 || *al[0].SubjectID != longID {
			t.Fatalf("create audit %+v", al)
		}
	})
}

// Changing JOBLIB_ADMIN_TOKEN revokes the token the previous value created;
// the old value cannot be brought back; an admin token of any format works
// next to a JWT secret.
func TestAdminTokenRotation(t *testing.T) {
	t.Parallel()
	cfg := server.DefaultConfig()
	cfg.JWTSecret = "s3cret"
	cfg.CredentialCacheTTL = 0
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		e := setupNoUsers(t, db, withServer(cfg))
		ctx := context.Background()
		const first, second = "plain-admin-secret", "jl_second"
		if err := e.svc.EnsureAdminToken(ctx, first); err != nil {
			t.Fatal(err)
		}
		if err := e.svc.EnsureAdminToken(ctx, first); err != nil {
			t.Fatal(err) // idempotent
		}
		e.do(first, "PUT", api+"/rooms/@global/jobs", map[string]any{"category": "modifiers", "name": "X"}).want(201)
		if err := e.svc.EnsureAdminToken(ctx, second); err != nil {
			t.Fatal(err)
		}
		if d := unauthorized(t, e.do(first, "GET", api+"/workers", nil)); d != "Token revoked" {
			t.Fatalf("old admin token: %q", d)
		}
		e.do(second, "GET", api+"/workers", nil).want(200)
		if err := e.svc.EnsureAdminToken(ctx, first); err == nil || !strings.Contains(err.Error(), "revoked") {
			t.Fatalf("re-using a revoked admin token: %v", err)
		}
		al, _ := e.svc.ListAudit(ctx, joblib.AuditTokenRevoke, 10)
		if len(al) != 1 || al[0].Actor != "startup" {
			t.Fatalf("audit %+v", al)
		}
	})
	bad := server.DefaultConfig()
	bad.JWTSecret = "s3cret"
	bad.AdminToken = jwt("x", map[string]any{"sub": "a"}, "HS256")
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "JOBLIB_ADMIN_TOKEN") {
		t.Fatalf("JWT-shaped admin token accepted: %v", err)
	}
	bad.AdminToken = "no.dots-but.not-a-jwt_5e1cc4797f9d70493f38e7675e2adb67"
	if err := bad.Validate(); err != nil {
		t.Fatalf("dotted non-JWT admin token refused: %v", err)
	}
	bad.AdminToken = "admintok"
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "JOBLIB_ADMIN_TOKEN is 8 characters long") {
		t.Fatalf("short admin token: %v", err)
	}
}

// JWTs are verified strictly and every refusal says why.
func TestJWTStrict(t *testing.T) {
	t.Parallel()
	const secret = "s3cret"
	cfg := server.DefaultConfig()
	cfg.JWTSecret = secret
	cfg.JWTIssuer = "https://zndraw.example"
	cfg.JWTSuperuserClaim = "is_superuser"
	cfg.CredentialCacheTTL = 0
	eachWith(t, []func(*setupOpts){withServer(cfg)}, func(t *testing.T, e *env) {
		sub := uuid.NewString()
		now := time.Now()
		claims := func(over map[string]any) map[string]any {
			c := map[string]any{"sub": sub, "aud": []string{"fastapi-users:auth"}, "iss": cfg.JWTIssuer, "exp": now.Add(time.Hour).Unix()}
			for k, v := range over {
				if v == nil {
					delete(c, k)
				} else {
					c[k] = v
				}
			}
			return c
		}
		e.do(jwt(secret, claims(nil), "HS256"), "POST", api+"/workers", nil).want(201)
		// Within the leeway (30 s) an expired token still works.
		e.do(jwt(secret, claims(map[string]any{"exp": now.Add(-10 * time.Second).Unix()}), "HS256"), "GET", api+"/workers", nil).want(200)
		cases := []struct {
			name, token, detail string
		}{
			{"no exp", jwt(secret, claims(map[string]any{"exp": nil}), "HS256"), "exp claim required"},
			{"expired", jwt(secret, claims(map[string]any{"exp": now.Add(-time.Minute).Unix()}), "HS256"), "expired"},
			{"exp not a number", jwt(secret, claims(map[string]any{"exp": "tomorrow"}), "HS256"), "exp claim must be a number"},
			{"nbf", jwt(secret, claims(map[string]any{"nbf": now.Add(time.Hour).Unix()}), "HS256"), "not valid yet"},
			{"no aud", jwt(secret, claims(map[string]any{"aud": nil}), "HS256"), "audience must be"},
			{"other aud", jwt(secret, claims(map[string]any{"aud": "other"}), "HS256"), "audience must be"},
			{"no iss", jwt(secret, claims(map[string]any{"iss": nil}), "HS256"), "issuer must be"},
			{"other iss", jwt(secret, claims(map[string]any{"iss": "https://evil.example"}), "HS256"), "issuer must be"},
			{"alg", jwt(secret, claims(nil), "HS512"), "algorithm"},
			{"alg none", jwt(secret, claims(nil), "none"), "algorithm"},
			{"signature", jwt("other", claims(nil), "HS256"), "bad signature"},
			{"sub name", jwt(secret, claims(map[string]any{"sub": "alice"}), "HS256"), "sub claim"},
			{"sub upper", jwt(secret, claims(map[string]any{"sub": strings.ToUpper(sub)}), "HS256"), "sub claim"},
			{"sub urn", jwt(secret, claims(map[string]any{"sub": "urn:uuid:" + sub}), "HS256"), "sub claim"},
			{"sub number", jwt(secret, claims(map[string]any{"sub": 7}), "HS256"), "sub claim"},
			{"superuser claim type", jwt(secret, claims(map[string]any{"is_superuser": "yes"}), "HS256"), "is_superuser claim"},
		}
		for _, c := range cases {
			d := unauthorized(t, e.do(c.token, "POST", api+"/workers", nil))
			if !strings.HasPrefix(d, "Invalid JWT: ") || !strings.Contains(d, c.detail) {
				t.Errorf("%s: detail %q, want it to mention %q", c.name, d, c.detail)
			}
		}
		// The superuser claim maps to superuser because it is enabled here.
		su := jwt(secret, claims(map[string]any{"is_superuser": true}), "HS256")
		e.do(su, "PUT", api+"/rooms/@global/jobs", map[string]any{"category": "modifiers", "name": "Y"}).want(201)
		e.do(jwt(secret, claims(map[string]any{"is_superuser": false}), "HS256"), "PUT", api+"/rooms/@global/jobs",
			map[string]any{"category": "modifiers", "name": "Z"}).problem(403, "forbidden")
		if n := e.total(api + "/workers"); n != 2 {
			t.Fatalf("%d workers", n)
		}
	})
	// Without the mapping, the claim is ignored.
	plain := server.DefaultConfig()
	plain.JWTSecret = secret
	eachWith(t, []func(*setupOpts){withServer(plain)}, func(t *testing.T, e *env) {
		tok := jwt(secret, map[string]any{"sub": uuid.NewString(), "aud": "fastapi-users:auth", "exp": time.Now().Add(time.Hour).Unix(), "is_superuser": true}, "HS256")
		e.do(tok, "PUT", api+"/rooms/@global/jobs", map[string]any{"category": "modifiers", "name": "Y"}).problem(403, "forbidden")
	})
	// Configured for HS384, HS256 is refused.
	hs384 := server.DefaultConfig()
	hs384.JWTSecret = secret
	hs384.JWTAlgorithm = "HS384"
	eachWith(t, []func(*setupOpts){withServer(hs384)}, func(t *testing.T, e *env) {
		c := map[string]any{"sub": uuid.NewString(), "aud": "fastapi-users:auth", "exp": time.Now().Add(time.Hour).Unix()}
		if d := unauthorized(t, e.do(jwt(secret, c, "HS256"), "POST", api+"/workers", nil)); !strings.Contains(d, "algorithm") {
			t.Fatalf("HS256 under HS384: %q", d)
		}
		e.do(jwtAlg(secret, c, "HS384"), "POST", api+"/workers", nil).want(201)
	})
}

// jwtAlg signs with the HMAC the header names (HS384 here).
func jwtAlg(secret string, claims map[string]any, alg string) string {
	enc := base64.RawURLEncoding
	hdr, _ := json.Marshal(map[string]any{"alg": alg, "typ": "JWT"})
	body, _ := json.Marshal(claims)
	msg := enc.EncodeToString(hdr) + "." + enc.EncodeToString(body)
	mac := hmac.New(sha512.New384, []byte(secret))
	mac.Write([]byte(msg))
	return msg + "." + enc.EncodeToString(mac.Sum(nil))
}

// Revoking a token also ends the sockets it opened: the socket is
// disconnected within the credential cache time and the worker it kept
// alive goes through the disconnect cleanup.
func TestRevocationEndsSockets(t *testing.T) {
	t.Parallel()
	cfg := server.DefaultConfig()
	cfg.CredentialCacheTTL = 200 * time.Millisecond
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		e := setup(t, db, withServer(cfg), withRealtime(realtimeCfg()))
		ctx := context.Background()
		job := e.registerJob(e.alice, "r1", "modifiers", "Rot")
		wid := job["worker_id"].(string)
		c := mustDialSIO(t, e.url, e.alice)
		c.mustCall("join_job_room", map[string]any{"job_name": "r1:modifiers:Rot", "worker_id": wid})
		b := mustDialSIO(t, e.url, e.bob)
		b.mustCall("join_room", map[string]any{"room_id": "r1"})
		if _, err := e.svc.RevokeUserTokens(ctx, "alice", "cli:test"); err != nil {
			t.Fatal(err)
		}
		// Past the grace the worker is gone, and it stays gone although its
		// owner's socket kept heartbeats fresh until the revocation.
		waitFor(t, 15*time.Second, func() bool { return e.total(api+"/workers") == 0 })
		if n := e.rt.IO().NumSockets(); n != 1 {
			t.Fatalf("%d sockets, want bob's only", n)
		}
		b.mustCall("join_room", map[string]any{"room_id": "r2"})
	})
}

// Finding 6 of the security pass: a revoked token's socket closed up to twice
// the credential cache TTL after the revocation (a re-check every TTL trusted
// answers up to TTL old). Sockets revoked at every phase of the re-check
// close within the TTL plus a second.
func TestRevocationClosesSocketsWithinTTL(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	const users = 8
	cfg := server.DefaultConfig()
	cfg.CredentialCacheTTL = ttl
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		e := setup(t, db, withServer(cfg), withRealtime(realtimeCfg()))
		ctx := context.Background()
		socks := make([]*sioClient, users)
		revoked := make([]time.Time, users)
		start := time.Now()
		for i := range users {
			name := fmt.Sprintf("carol%d", i)
			tok, _, err := e.svc.CreateToken(ctx, name, false)
			if err != nil {
				t.Fatal(err)
			}
			// Spread over one TTL, so that some revocation falls just
			// after whatever re-check would trust the cached answer.
			time.Sleep(time.Until(start.Add(time.Duration(i) * ttl / users)))
			socks[i] = mustDialSIO(t, e.url, tok) // the credential is cached now
			if _, err := e.svc.RevokeUserTokens(ctx, name, "cli:test"); err != nil {
				t.Fatal(err)
			}
			revoked[i] = time.Now()
		}
		var worst time.Duration
		for i, c := range socks {
			d := c.waitClosed(2*ttl + 5*time.Second).Sub(revoked[i])
			worst = max(worst, d)
		}
		if worst > ttl+time.Second {
			t.Fatalf("a revoked token's socket closed %s after the revocation; the bound is the TTL (%s) + 1s", worst, ttl)
		}
		t.Logf("slowest close %s after revocation (TTL %s)", worst, ttl)
	})
}
