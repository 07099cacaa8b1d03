package server

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/clientaddr"
	"github.com/zndraw/joblib/internal/limits"
	"github.com/zndraw/joblib/internal/lru"
	"github.com/zndraw/joblib/internal/ratelimit"
	"github.com/zndraw/joblib/joblib"
)

// DefaultJWTAudience is the audience fastapi-users puts in its access tokens.
const DefaultJWTAudience = "fastapi-users:auth"

// authCookie is the cookie a browser may carry its token in.
const authCookie = "joblib_token"

// jwtAlgorithms are the HMAC algorithms a JWT secret can be configured for.
var jwtAlgorithms = map[string]func() hash.Hash{"HS256": sha256.New, "HS384": sha512.New384, "HS512": sha512.New}

// authenticator resolves credentials to a principal: joblib API tokens, and,
// when a secret is configured, JWTs in the fastapi-users shape (`sub` = user
// id) so that a ZnDraw host can share its tokens with us.
type authenticator struct {
	svc   *joblib.Service
	jwt   jwtConfig
	now   func() time.Time
	cache authCache
	// failures is each client address's budget of credentials looked up
	// and refused (Config.AuthFailureRate).
	failures *ratelimit.Limiter[string]
	lookups  atomic.Int64 // credentials resolved (not answered by a cache)
}

// jwtConfig is how JWTs are verified.
type jwtConfig struct {
	secret         []byte
	alg            string
	audience       string
	issuer         string
	leeway         time.Duration
	superuserClaim string
}

// DefaultCredentialCacheTTL is how long a resolved credential is reused
// without asking the database again; a revocation, an expiry, a deactivated
// user or a promotion takes at most this long to apply on every node.
const DefaultCredentialCacheTTL = 5 * time.Second

// authCacheMax bounds the cache; when full it is emptied (a cheap, correct
// eviction for a cache this short-lived).
const authCacheMax = 10000

type authCache struct {
	ttl time.Duration
	mu  sync.Mutex
	m   map[string]authEntry
	// refused are credentials looked up and refused, for the TTL: asking
	// again with the same bad token costs no lookup.
	refused *lru.Cache[string, authRefusal]
}

type authRefusal struct {
	err error
	at  time.Time
}

type authEntry struct {
	p  joblib.Principal
	at time.Time // when the database (or the JWT) said so
}

// get returns a cached principal resolved less than maxAge (at most the
// TTL) ago.
func (c *authCache) get(key string, now time.Time, maxAge time.Duration) (joblib.Principal, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok || now.Sub(e.at) >= min(maxAge, c.ttl) {
		return joblib.Principal{}, false
	}
	return e.p, true
}

func (c *authCache) put(key string, p joblib.Principal, now time.Time) {
	if c.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= authCacheMax {
		c.m = make(map[string]authEntry)
	}
	c.m[key] = authEntry{p: p, at: now}
}

// refusal returns why a credential was refused less than the TTL ago.
func (c *authCache) refusal(key string, now time.Time) (error, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.refused == nil {
		return nil, false
	}
	r, ok := c.refused.Get(key)
	if !ok || now.Sub(r.at) >= c.ttl {
		return nil, false
	}
	return r.err, true
}

func (c *authCache) refuse(key string, err error, now time.Time) {
	if c.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.refused == nil {
		c.refused = lru.New[string, authRefusal](authCacheMax)
	}
	c.refused.Put(key, authRefusal{err: err, at: now})
}

// tokenFrom extracts a bearer token from the Authorization header or the cookie.
func tokenFrom(r *http.Request) string {
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, tok, ok := strings.Cut(h, " ")
		if ok && strings.EqualFold(scheme, "Bearer") {
			return strings.TrimSpace(tok)
		}
		return ""
	}
	if c, err := r.Cookie(authCookie); err == nil {
		return c.Value
	}
	return ""
}

// authenticate resolves a raw token. Unknown, malformed or expired
// credentials are joblib.ErrUnauthorized (a *joblib.AuthError names why).
func (a *authenticator) authenticate(ctx context.Context, token string) (joblib.Principal, error) {
	return a.authenticateFresh(ctx, token, a.cache.ttl)
}

// authenticateFresh is authenticate reusing only a resolution younger than
// maxAge: the sockets' re-check uses it to close a revoked token's sockets
// within the TTL, not within a tick plus the TTL.
//
// A credential refused is remembered for the TTL. The refusals of lookups
// are charged to the client address ctx carries (clientaddr.FromContext): once its
// budget is spent, a credential that is not cached answers 429 without a
// lookup, so made-up tokens cannot turn into a database query each.
func (a *authenticator) authenticateFresh(ctx context.Context, token string, maxAge time.Duration) (joblib.Principal, error) {
	if token == "" {
		return joblib.Principal{}, joblib.ErrUnauthorized
	}
	key := joblib.HashToken(token)
	now := a.now()
	if p, ok := a.cache.get(key, now, maxAge); ok {
		return p, nil
	}
	if err, ok := a.cache.refusal(key, now); ok {
		return joblib.Principal{}, err
	}
	addr := clientaddr.FromContext(ctx)
	budgeted := addr != ""
	if budgeted {
		if ok, wait := a.failures.Ready(addr); !ok {
			return joblib.Principal{}, &joblib.Error{Code: joblib.CodeRateLimited, Limit: limits.AuthFailures, RetryAfter: wait,
				Detail: "too many refused credentials from this address; retry after the time in Retry-After"}
		}
	}
	a.lookups.Add(1)
	p, err := a.resolve(ctx, token)
	switch {
	case err == nil:
		a.cache.put(key, p, a.now())
	case errors.Is(err, joblib.ErrUnauthorized):
		a.cache.refuse(key, err, a.now())
		if budgeted {
			a.failures.Allow(addr)
		}
	}
	return p, err
}

func (a *authenticator) resolve(ctx context.Context, token string) (joblib.Principal, error) {
	if len(a.jwt.secret) == 0 || !looksLikeJWT(token) {
		return a.svc.AuthenticateToken(ctx, token)
	}
	c, err := a.verifyJWT(token)
	if err != nil {
		return joblib.Principal{}, err
	}
	p, err := a.svc.PrincipalForSubject(ctx, c.sub)
	if err != nil {
		return p, err
	}
	if a.jwt.superuserClaim != "" {
		// The host is authoritative for the flag when the mapping is on.
		p.Superuser = c.superuser
	}
	return p, nil
}

// looksLikeJWT reports whether a token has a JWT's shape: three dot-separated
// base64url parts whose first decodes to a JSON object naming an algorithm.
// Anything else (joblib's jl_ tokens, any other admin token) is an API token.
func looksLikeJWT(token string) bool {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return false
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil {
		return false
	}
	var hdr map[string]any
	if json.Unmarshal(raw, &hdr) != nil {
		return false
	}
	_, ok := hdr["alg"]
	return ok
}

// jwtClaims is what a verified JWT tells us.
type jwtClaims struct {
	sub       uuid.UUID
	superuser bool
}

func jwtRefused(reason string) error { return joblib.Unauthorized("Invalid JWT: %s", reason) }

// verifyJWT checks a JWT strictly: the configured algorithm only, the
// signature, exp (required), nbf, aud, iss and a canonical UUID subject, with
// a small leeway on the times.
func (a *authenticator) verifyJWT(token string) (jwtClaims, error) {
	parts := strings.Split(token, ".")
	hdrRaw, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil {
		return jwtClaims{}, jwtRefused("malformed header")
	}
	var hdr struct {
		Alg string `json:"alg"`
	}
	if json.Unmarshal(hdrRaw, &hdr) != nil {
		return jwtClaims{}, jwtRefused("malformed header")
	}
	if hdr.Alg != a.jwt.alg {
		return jwtClaims{}, jwtRefused(fmt.Sprintf("algorithm %q is not the configured %s", hdr.Alg, a.jwt.alg))
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return jwtClaims{}, jwtRefused("malformed signature")
	}
	mac := hmac.New(jwtAlgorithms[a.jwt.alg], a.jwt.secret)
	mac.Write([]byte(parts[0] + "." + parts[1]))
	if !hmac.Equal(sig, mac.Sum(nil)) {
		return jwtClaims{}, jwtRefused("bad signature")
	}
	body, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return jwtClaims{}, jwtRefused("malformed claims")
	}
	var claims map[string]json.RawMessage
	if json.Unmarshal(body, &claims) != nil {
		return jwtClaims{}, jwtRefused("malformed claims")
	}
	now := a.now()
	leeway := a.jwt.leeway.Seconds()
	exp, ok, err := numericClaim(claims, "exp")
	switch {
	case err != nil:
		return jwtClaims{}, jwtRefused(err.Error())
	case !ok:
		return jwtClaims{}, jwtRefused("exp claim required")
	case float64(now.Unix()) >= exp+leeway:
		return jwtClaims{}, jwtRefused("expired")
	}
	if nbf, ok, err := numericClaim(claims, "nbf"); err != nil {
		return jwtClaims{}, jwtRefused(err.Error())
	} else if ok && float64(now.Unix())+leeway < nbf {
		return jwtClaims{}, jwtRefused("not valid yet (nbf)")
	}
	if a.jwt.audience != "" && !audienceOK(claims["aud"], a.jwt.audience) {
		return jwtClaims{}, jwtRefused(fmt.Sprintf("audience must be %q", a.jwt.audience))
	}
	if a.jwt.issuer != "" {
		var iss string
		if json.Unmarshal(claims["iss"], &iss) != nil || iss != a.jwt.issuer {
			return jwtClaims{}, jwtRefused(fmt.Sprintf("issuer must be %q", a.jwt.issuer))
		}
	}
	var sub string
	if json.Unmarshal(claims["sub"], &sub) != nil {
		return jwtClaims{}, jwtRefused("sub claim must be a user id")
	}
	id, err := uuid.Parse(sub)
	if err != nil || id.String() != sub {
		return jwtClaims{}, jwtRefused("sub claim must be a user id (a lowercase UUID like 123e4567-e89b-12d3-a456-426614174000)")
	}
	c := jwtClaims{sub: id}
	if a.jwt.superuserClaim != "" {
		var v bool
		if raw, ok := claims[a.jwt.superuserClaim]; ok && json.Unmarshal(raw, &v) != nil {
			return jwtClaims{}, jwtRefused(fmt.Sprintf("%s claim must be true or false", a.jwt.superuserClaim))
		}
		c.superuser = v
	}
	return c, nil
}

// numericClaim reads a NumericDate claim; ok is false when it is absent.
func numericClaim(claims map[string]json.RawMessage, name string) (float64, bool, error) {
	raw, ok := claims[name]
	if !ok {
		return 0, false, nil
	}
	var v float64
	if json.Unmarshal(raw, &v) != nil {
		return 0, false, fmt.Errorf("%s claim must be a number", name)
	}
	return v, true, nil
}

func audienceOK(raw json.RawMessage, want string) bool {
	if len(raw) == 0 {
		return false
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return one == want
	}
	var many []string
	if json.Unmarshal(raw, &many) == nil {
		return slices.Contains(many, want)
	}
	return false
}
