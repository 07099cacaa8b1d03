package server

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/joblib"
)

// jwtAudience is the audience fastapi-users puts in its access tokens.
const jwtAudience = "fastapi-users:auth"

// authCookie is the cookie a browser may carry its token in.
const authCookie = "joblib_token"

// authenticator resolves credentials to a principal: joblib API tokens, and,
// when a secret is configured, HS256 JWTs in the fastapi-users shape
// (`sub` = user id) so that a ZnDraw host can share its tokens with us.
type authenticator struct {
	svc       *joblib.Service
	jwtSecret []byte
	now       func() time.Time
	cache     authCache
}

// authCacheTTL is how long a resolved credential is reused without asking
// the database again; a deactivated user or a promotion takes at most this
// long to apply.
const authCacheTTL = 5 * time.Second

// authCacheMax bounds the cache; when full it is emptied (a cheap, correct
// eviction for a cache this short-lived).
const authCacheMax = 10000

type authCache struct {
	mu sync.Mutex
	m  map[string]authEntry
}

type authEntry struct {
	p   joblib.Principal
	exp time.Time
}

func (c *authCache) get(key string, now time.Time) (joblib.Principal, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok || now.After(e.exp) {
		return joblib.Principal{}, false
	}
	return e.p, true
}

func (c *authCache) put(key string, p joblib.Principal, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= authCacheMax {
		c.m = make(map[string]authEntry)
	}
	c.m[key] = authEntry{p: p, exp: now.Add(authCacheTTL)}
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
// credentials are joblib.ErrUnauthorized.
func (a *authenticator) authenticate(ctx context.Context, token string) (joblib.Principal, error) {
	if token == "" {
		return joblib.Principal{}, joblib.ErrUnauthorized
	}
	key := joblib.HashToken(token)
	if p, ok := a.cache.get(key, a.now()); ok {
		return p, nil
	}
	p, err := a.resolve(ctx, token)
	if err == nil {
		a.cache.put(key, p, a.now())
	}
	return p, err
}

func (a *authenticator) resolve(ctx context.Context, token string) (joblib.Principal, error) {
	if strings.HasPrefix(token, joblib.TokenPrefix) || len(a.jwtSecret) == 0 {
		return a.svc.AuthenticateToken(ctx, token)
	}
	sub, err := a.verifyJWT(token)
	if err != nil {
		return joblib.Principal{}, joblib.ErrUnauthorized
	}
	return a.svc.PrincipalForSubject(ctx, sub)
}

var errBadJWT = errors.New("invalid token")

// verifyJWT checks an HS256 JWT's signature, expiry, not-before and audience,
// and returns its subject.
func (a *authenticator) verifyJWT(token string) (uuid.UUID, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return uuid.Nil, errBadJWT
	}
	hdrRaw, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil {
		return uuid.Nil, errBadJWT
	}
	var hdr struct {
		Alg string `json:"alg"`
	}
	if json.Unmarshal(hdrRaw, &hdr) != nil || hdr.Alg != "HS256" {
		return uuid.Nil, errBadJWT
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return uuid.Nil, errBadJWT
	}
	mac := hmac.New(sha256.New, a.jwtSecret)
	mac.Write([]byte(parts[0] + "." + parts[1]))
	if !hmac.Equal(sig, mac.Sum(nil)) {
		return uuid.Nil, errBadJWT
	}
	body, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return uuid.Nil, errBadJWT
	}
	var claims struct {
		Sub string          `json:"sub"`
		Exp *float64        `json:"exp"`
		Nbf *float64        `json:"nbf"`
		Aud json.RawMessage `json:"aud"`
	}
	if json.Unmarshal(body, &claims) != nil {
		return uuid.Nil, errBadJWT
	}
	now := float64(a.now().Unix())
	if claims.Exp != nil && now >= *claims.Exp {
		return uuid.Nil, errBadJWT
	}
	if claims.Nbf != nil && now < *claims.Nbf {
		return uuid.Nil, errBadJWT
	}
	if len(claims.Aud) > 0 && !audienceOK(claims.Aud) {
		return uuid.Nil, errBadJWT
	}
	id, err := uuid.Parse(claims.Sub)
	if err != nil {
		return uuid.Nil, errBadJWT
	}
	return id, nil
}

func audienceOK(raw json.RawMessage) bool {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return one == jwtAudience
	}
	var many []string
	if json.Unmarshal(raw, &many) == nil {
		for _, a := range many {
			if a == jwtAudience {
				return true
			}
		}
	}
	return false
}
