package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/clientaddr"
	"github.com/zndraw/joblib/internal/limits"
	"github.com/zndraw/joblib/internal/lru"
	"github.com/zndraw/joblib/internal/ratelimit"
	"github.com/zndraw/joblib/joblib"
)

// RoomAuthConfig delegates room access to the host application: before a
// REST call touches a room or a socket joins one, joblib asks URL whether the
// caller may read or write that room.
type RoomAuthConfig struct {
	// URL receives POST {"user_id", "room_id", "access": "read"|"write"}
	// with the caller's Authorization forwarded; 2xx allows, 401/403/404
	// refuse, anything else (or no answer) is an outage. Empty disables the
	// check (every authenticated caller may use every room).
	URL string `env:"ROOM_AUTH_URL"`
	// Timeout bounds one question to the host.
	Timeout time.Duration `env:"ROOM_AUTH_TIMEOUT" envDefault:"2s"`
	// CacheTTL is how long an answer (allow or refuse) is reused; 0 asks
	// every time.
	CacheTTL time.Duration `env:"ROOM_AUTH_CACHE_TTL" envDefault:"5s"`
	// CacheSize bounds the cached answers; past it the least recently
	// used one goes.
	CacheSize int `env:"ROOM_AUTH_CACHE_SIZE" envDefault:"10000"`
	// Rate and Burst are each client address's budget of questions whose
	// answer is not cached (a room never asked about, or one refused):
	// past it such a request answers 429 without asking. Refreshing an
	// allowed answer that expired is free. Rate 0 disables the budget.
	Rate  float64 `env:"ROOM_AUTH_RATE" envDefault:"50"`
	Burst int     `env:"ROOM_AUTH_BURST" envDefault:"500"`
	// FailOpen allows access when the host cannot be reached; by default
	// such calls answer 503 (fail closed).
	FailOpen bool `env:"ROOM_AUTH_FAIL_OPEN" envDefault:"false"`
	// OutageGrace is how long a room a socket already holds outlives a host
	// that stops answering: the socket's periodic re-check (and a session
	// recovered on the same node) keeps a room the host allowed within this
	// time, while new joins and REST calls fail closed. A host restart or a
	// slow answer then does not take every UI out of its rooms. 0 leaves
	// the room at the first unanswered re-check. The grace is counted from
	// the host's last allowing answer cached on this node, so it needs
	// CacheTTL > 0.
	OutageGrace time.Duration `env:"ROOM_AUTH_OUTAGE_GRACE" envDefault:"5m"`
}

// DefaultRoomAuthConfig returns the documented defaults (disabled).
func DefaultRoomAuthConfig() RoomAuthConfig {
	return RoomAuthConfig{Timeout: 2 * time.Second, CacheTTL: 5 * time.Second, CacheSize: 10000, Rate: 50, Burst: 500,
		OutageGrace: 5 * time.Minute}
}

func (c RoomAuthConfig) validate() error {
	if c.URL == "" {
		return nil
	}
	u, err := url.Parse(c.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("JOBLIB_ROOM_AUTH_URL must be an http(s) URL, got %q", c.URL)
	}
	if c.Timeout <= 0 {
		return fmt.Errorf("JOBLIB_ROOM_AUTH_TIMEOUT must be positive, got %s", c.Timeout)
	}
	if c.CacheTTL < 0 || c.CacheSize < 1 {
		return fmt.Errorf("JOBLIB_ROOM_AUTH_CACHE_TTL must not be negative and JOBLIB_ROOM_AUTH_CACHE_SIZE must be positive")
	}
	if c.OutageGrace < 0 {
		return fmt.Errorf("JOBLIB_ROOM_AUTH_OUTAGE_GRACE must not be negative, got %s", c.OutageGrace)
	}
	if c.Rate < 0 || (c.Rate > 0 && c.Burst < 1) {
		return fmt.Errorf("JOBLIB_ROOM_AUTH_RATE must not be negative and JOBLIB_ROOM_AUTH_BURST must be positive, got %g and %d", c.Rate, c.Burst)
	}
	return nil
}

// Room access kinds asked of the host.
const (
	accessRead  = "read"
	accessWrite = "write"
)

// errRoomAuthUnavailable means the host could not answer.
var errRoomAuthUnavailable = errors.New("room authorization service unavailable")

// roomAuth asks the host and caches its answers.
type roomAuth struct {
	cfg    RoomAuthConfig
	client *http.Client
	now    func() time.Time
	// misses is each client address's budget of questions about answers
	// that are not cached (see RoomAuthConfig.Rate).
	misses *ratelimit.Limiter[string]

	mu    sync.Mutex
	cache *lru.Cache[roomAuthKey, roomAuthEntry]
}

type roomAuthKey struct {
	user   uuid.UUID
	token  string // hash: a different credential of the same user may be judged differently
	room   string
	access string
}

type roomAuthEntry struct {
	allowed bool
	at      time.Time // when the host answered
}

func newRoomAuth(cfg RoomAuthConfig) *roomAuth {
	if cfg.URL == "" {
		return nil
	}
	def := DefaultRoomAuthConfig()
	if cfg.Timeout <= 0 {
		cfg.Timeout = def.Timeout
	}
	if cfg.CacheSize <= 0 {
		cfg.CacheSize = def.CacheSize
	}
	return &roomAuth{cfg: cfg, client: &http.Client{Timeout: cfg.Timeout}, now: time.Now,
		misses: ratelimit.New[string](cfg.Rate, cfg.Burst), cache: lru.New[roomAuthKey, roomAuthEntry](cfg.CacheSize)}
}

// special rooms are joblib's own; the host does not know them.
func specialRoom(room string) bool { return room == joblib.RoomGlobal || room == joblib.RoomInternal }

// objectRoom returns the room a job or provider belongs to: the room part of
// its full name ({room}:{category}:{name}, the same split the domain resolves
// the object with, so the room asked about is the room of the object that is
// served). ok is false for a name that cannot name an object (no object is
// found by it either).
func objectRoom(fullName string) (room string, ok bool) {
	room, _, _, ok = joblib.SplitFullName(fullName)
	return room, ok && joblib.ValidateRoomID(room) == nil
}

// checkObject is check for the room the job or provider named fullName
// belongs to. The room a request is addressed through (the URL's, or
// @global's) is only where the caller stands: under room delegation an object
// is reached only with access to its own room.
func (ra *roomAuth) checkObject(ctx context.Context, p joblib.Principal, token, fullName, access string) error {
	room, ok := objectRoom(fullName)
	if !ok {
		return nil
	}
	return ra.check(ctx, p, token, room, access)
}

// check returns nil when p may access room, a *joblib.Error (403) when the
// host refuses, and errRoomAuthUnavailable when it cannot say (unless the
// configuration fails open). token is the caller's raw credential, forwarded
// as a bearer token. A question whose answer is not cached is charged to the
// client address ctx carries (clientaddr.FromContext: a REST request's, or
// a socket's when the caller put it there); past that budget it is a 429 and
// the host is not asked. The server's own re-checks carry none.
func (ra *roomAuth) check(ctx context.Context, p joblib.Principal, token, room, access string) error {
	if ra == nil {
		return nil
	}
	return ra.checkGrant(ctx, p, token, room, access, ra.cfg.CacheTTL, 0)
}

// checkHeld is check for a room a socket already holds (the sockets'
// re-check, a recovered session), reusing only an answer younger than maxAge
// (at most the cache TTL), so that the re-check keeps its bound. When the
// host does not answer, an allowing answer cached less than OutageGrace ago
// still stands; a refusal is never outlived.
func (ra *roomAuth) checkHeld(ctx context.Context, p joblib.Principal, token, room, access string, maxAge time.Duration) error {
	return ra.checkGrant(ctx, p, token, room, access, maxAge, ra.cfg.OutageGrace)
}

// checkGrant is check reusing only an answer younger than maxAge, where an
// allowing answer younger than grace stands in for a host that cannot
// answer.
func (ra *roomAuth) checkGrant(ctx context.Context, p joblib.Principal, token, room, access string, maxAge, grace time.Duration) error {
	if ra == nil || specialRoom(room) {
		return nil
	}
	key := roomAuthKey{user: p.ID, token: joblib.HashToken(token), room: room, access: access}
	now := ra.now()
	ra.mu.Lock()
	e, cached := ra.cache.Get(key)
	ra.mu.Unlock()
	if !cached || now.Sub(e.at) >= min(maxAge, ra.cfg.CacheTTL) {
		// Refreshing an allowed answer is what every member of a room
		// does once per TTL; anything else is charged to the address.
		if addr := clientaddr.FromContext(ctx); addr != "" && (!cached || !e.allowed) {
			if ok, wait := ra.misses.Allow(addr); !ok {
				return &joblib.Error{Code: joblib.CodeRateLimited, Limit: limits.RoomAuthRate, RetryAfter: wait,
					Detail: "too many room authorization questions from this address; retry after the time in Retry-After"}
			}
		}
		allowed, err := ra.ask(ctx, p, token, room, access)
		if err != nil {
			if ra.cfg.FailOpen || (cached && e.allowed && now.Sub(e.at) < grace) {
				return nil
			}
			return err
		}
		e = roomAuthEntry{allowed: allowed, at: now}
		if ra.cfg.CacheTTL > 0 {
			ra.mu.Lock()
			ra.cache.Put(key, e)
			ra.mu.Unlock()
		}
	}
	if !e.allowed {
		return &joblib.Error{Code: joblib.CodeForbidden, Detail: fmt.Sprintf("No %s access to room '%s'", access, room)}
	}
	return nil
}

// cached is the number of cached answers.
func (ra *roomAuth) cached() int {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	return ra.cache.Len()
}

func (ra *roomAuth) ask(ctx context.Context, p joblib.Principal, token, room, access string) (bool, error) {
	var uid *string
	if p.ID != uuid.Nil {
		s := p.ID.String()
		uid = &s
	}
	body, err := json.Marshal(map[string]any{"user_id": uid, "room_id": room, "access": access})
	if err != nil {
		return false, fmt.Errorf("encode room auth request: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, ra.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ra.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return false, fmt.Errorf("%w: %w", errRoomAuthUnavailable, err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := ra.client.Do(req)
	if err != nil {
		return false, fmt.Errorf("%w: %w", errRoomAuthUnavailable, err)
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	switch {
	case res.StatusCode >= 200 && res.StatusCode < 300:
		return true, nil
	case res.StatusCode == http.StatusUnauthorized, res.StatusCode == http.StatusForbidden, res.StatusCode == http.StatusNotFound:
		return false, nil
	}
	return false, fmt.Errorf("%w: host answered %d", errRoomAuthUnavailable, res.StatusCode)
}
