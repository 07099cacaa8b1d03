package server

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zndraw/joblib/internal/clientaddr"
	"github.com/zndraw/joblib/internal/jsonguard"
	"github.com/zndraw/joblib/internal/limits"
	"github.com/zndraw/joblib/internal/ratelimit"
	"github.com/zndraw/joblib/joblib"
)

// Config is the HTTP side's configuration (JOBLIB_-prefixed environment
// variables; see the tags for names and defaults).
type Config struct {
	// ListenAddr is where serve listens.
	ListenAddr string `env:"LISTEN_ADDR" envDefault:":8080"`
	// MaxBodyBytes caps request bodies; larger ones answer 413.
	MaxBodyBytes int64 `env:"MAX_BODY_BYTES" envDefault:"8388608"`
	// AdminToken, when set, is an API token of a superuser named "admin"
	// that exists from start-up on.
	AdminToken string `env:"ADMIN_TOKEN"`
	// JWTSecret, when set, also accepts JWTs signed with it whose `sub` is a
	// user id (ZnDraw/fastapi-users tokens).
	JWTSecret string `env:"JWT_SECRET"`
	// JWTAlgorithm is the only algorithm accepted: HS256, HS384 or HS512.
	JWTAlgorithm string `env:"JWT_ALGORITHM" envDefault:"HS256"`
	// JWTAudience must be in a JWT's aud claim.
	JWTAudience string `env:"JWT_AUDIENCE" envDefault:"fastapi-users:auth"`
	// JWTIssuer, when set, must be a JWT's iss claim.
	JWTIssuer string `env:"JWT_ISSUER"`
	// JWTLeeway is the clock skew allowed on exp and nbf.
	JWTLeeway time.Duration `env:"JWT_LEEWAY" envDefault:"30s"`
	// JWTSuperuserClaim, when set, names a boolean claim (e.g. is_superuser)
	// that decides whether a JWT's caller is a superuser.
	JWTSuperuserClaim string `env:"JWT_SUPERUSER_CLAIM"`
	// AllowedOrigins are the browser origins (host patterns) besides the
	// server's own host from which cookie-authenticated writes are accepted,
	// sockets opened and the REST API called cross-origin (CORS, without
	// credentials: see cors.go).
	AllowedOrigins []string `env:"ALLOWED_ORIGINS"`
	// TrustedProxies are the networks (CIDRs or addresses) of reverse
	// proxies whose X-Forwarded-For / Forwarded headers name the client.
	// Empty (the default): the TCP peer is the client.
	TrustedProxies []string `env:"TRUSTED_PROXIES"`
	// CredentialCacheTTL is how long a resolved token is reused without
	// reading the database: revocations and expiries apply within it on
	// every node. 0 disables the cache.
	CredentialCacheTTL time.Duration `env:"CREDENTIAL_CACHE_TTL" envDefault:"5s"`
	// AuthFailureRate and AuthFailureBurst are each client address's budget
	// of credentials looked up and refused (unknown, revoked, expired); past
	// it a credential that is not cached answers 429 without a lookup. 0
	// disables the budget.
	AuthFailureRate  float64 `env:"AUTH_FAILURE_RATE" envDefault:"50"`
	AuthFailureBurst int     `env:"AUTH_FAILURE_BURST" envDefault:"500"`
	// PublicReads lets unauthenticated callers use the GET endpoints.
	PublicReads bool `env:"PUBLIC_READS" envDefault:"false"`
	// MaxJSONDepth caps the nesting of JSON request bodies; deeper ones
	// answer 422 and nothing is stored.
	MaxJSONDepth int `env:"MAX_JSON_DEPTH" envDefault:"64"`
	// MaxListOffset is the deepest `offset` a listing accepts; deeper ones
	// answer 422.
	MaxListOffset int `env:"MAX_LIST_OFFSET" envDefault:"10000"`
	// ReadDBTimeout is the database time budget of a listing request
	// (GET of workers, jobs, tasks, providers); past it the request's
	// statements are cancelled and it answers 503. 0 disables it.
	ReadDBTimeout time.Duration `env:"READ_DB_TIMEOUT" envDefault:"5s"`
	// WriteDBTimeout is the database time budget of a mutating request.
	WriteDBTimeout time.Duration `env:"WRITE_DB_TIMEOUT" envDefault:"15s"`
	// MetricsToken, when set, is the bearer token /metrics requires.
	MetricsToken string `env:"METRICS_TOKEN"`
	// MetricsAddr, when set, serves /metrics on this address only (not on
	// ListenAddr).
	MetricsAddr string `env:"METRICS_ADDR"`
	// HomeRouting forwards each claim and status report to its user's home
	// node (PostgreSQL clusters; see home.go), where the user's calls share
	// statements: the database's work per task does not grow with the
	// number of nodes. Off: every node serves the calls it receives.
	HomeRouting bool `env:"HOME_ROUTING" envDefault:"true"`
	// RoomAuth delegates room access decisions to the host application.
	RoomAuth RoomAuthConfig
}

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{ListenAddr: ":8080", MaxBodyBytes: 8 << 20, JWTAlgorithm: "HS256", JWTAudience: DefaultJWTAudience,
		JWTLeeway: 30 * time.Second, CredentialCacheTTL: DefaultCredentialCacheTTL, RoomAuth: DefaultRoomAuthConfig(),
		AuthFailureRate: 50, AuthFailureBurst: 500,
		MaxJSONDepth: jsonguard.DefaultMaxDepth, MaxListOffset: DefaultMaxListOffset,
		ReadDBTimeout: 5 * time.Second, WriteDBTimeout: 15 * time.Second, HomeRouting: true}
}

// Validate rejects configurations the server cannot run with; errors name the
// variable.
func (c Config) Validate() error {
	if _, ok := jwtAlgorithms[c.JWTAlgorithm]; !ok {
		return fmt.Errorf("JOBLIB_JWT_ALGORITHM must be HS256, HS384 or HS512, got %q", c.JWTAlgorithm)
	}
	if c.JWTLeeway < 0 || c.JWTLeeway > 5*time.Minute {
		return fmt.Errorf("JOBLIB_JWT_LEEWAY must be between 0 and 5m, got %s", c.JWTLeeway)
	}
	if c.CredentialCacheTTL < 0 || c.CredentialCacheTTL > time.Minute {
		return fmt.Errorf("JOBLIB_CREDENTIAL_CACHE_TTL must be between 0 and 1m, got %s", c.CredentialCacheTTL)
	}
	if c.AuthFailureRate < 0 || (c.AuthFailureRate > 0 && c.AuthFailureBurst < 1) {
		return fmt.Errorf("JOBLIB_AUTH_FAILURE_RATE must not be negative and JOBLIB_AUTH_FAILURE_BURST must be positive, got %g and %d", c.AuthFailureRate, c.AuthFailureBurst)
	}
	if c.JWTSecret != "" && c.AdminToken != "" && looksLikeJWT(c.AdminToken) {
		return errors.New("JOBLIB_ADMIN_TOKEN has the shape of a JWT (three dot-separated base64url parts) and JOBLIB_JWT_SECRET is set: it would be verified as a JWT and never match; choose an admin token without that shape (e.g. jl_...)")
	}
	if c.AdminToken != "" {
		if err := checkAdminToken(c.AdminToken); err != nil {
			return err
		}
	}
	if _, err := clientaddr.ParseProxies(c.TrustedProxies); err != nil {
		return fmt.Errorf("JOBLIB_TRUSTED_PROXIES: %w", err)
	}
	return c.RoomAuth.validate()
}

// DefaultMaxListOffset is the default of JOBLIB_MAX_LIST_OFFSET.
const DefaultMaxListOffset = 10000

// Server is joblib's HTTP surface. Build it with New and mount Handler.
type Server struct {
	svc        *joblib.Service
	cfg        Config
	log        *slog.Logger
	auth       *authenticator
	rooms      *roomAuth   // nil without JOBLIB_ROOM_AUTH_URL
	home       *homeRouter // nil without JOBLIB_HOME_ROUTING or a hot path (SQLite)
	proxies    clientaddr.Proxies
	mux        *http.ServeMux
	rejections *limits.Rejections

	routesMu sync.Mutex
	patterns []string // every pattern registered on mux (see routeMux)

	// Set by NewRealtime: the dashboard's trigger and snapshot.
	dashPoke     atomic.Pointer[func()]
	dashSnapshot atomic.Pointer[func(context.Context) (*DashboardView, error)]
	// keepAlive is the socket keep-alive interval (set by NewRealtime):
	// an operator sweep's threshold must be at least twice it.
	keepAlive atomic.Int64
}

// New builds the HTTP server over a service.
func New(svc *joblib.Service, cfg Config, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	def := DefaultConfig()
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = def.MaxBodyBytes
	}
	if cfg.MaxJSONDepth <= 0 {
		cfg.MaxJSONDepth = def.MaxJSONDepth
	}
	if cfg.MaxListOffset <= 0 {
		cfg.MaxListOffset = def.MaxListOffset
	}
	s := &Server{
		svc: svc,
		cfg: cfg,
		log: log,
		auth: &authenticator{svc: svc, now: time.Now, cache: authCache{ttl: cfg.CredentialCacheTTL}, jwt: jwtConfig{
			secret: []byte(cfg.JWTSecret), alg: cmp.Or(cfg.JWTAlgorithm, "HS256"), audience: cmp.Or(cfg.JWTAudience, DefaultJWTAudience),
			issuer: cfg.JWTIssuer, leeway: cfg.JWTLeeway, superuserClaim: cfg.JWTSuperuserClaim,
		}, failures: ratelimit.New[string](cfg.AuthFailureRate, cfg.AuthFailureBurst)},
		rooms: newRoomAuth(cfg.RoomAuth),
		mux:   http.NewServeMux(),

		rejections: limits.NewRejections(),
	}
	proxies, err := clientaddr.ParseProxies(cfg.TrustedProxies)
	if err != nil {
		// Config.Validate refuses this at start-up; an embedder that did
		// not call it gets no proxy trusted, never a spoofable address.
		log.Error("JOBLIB_TRUSTED_PROXIES ignored", "err", err)
	}
	s.proxies = proxies
	if cfg.HomeRouting && svc.DB().Caps().HotPath {
		// The calls that share statements (group commit) run on the hot
		// path: elsewhere a node has nothing to gain from their company.
		s.home = newHomeRouter(svc, cfg, log, s.fail, s.auth.authenticate)
	}
	s.routes()
	return s
}

// Rejections is the joblib_limit_rejections_total counter every budget of
// this server (REST and Socket.IO) counts into; register it with the
// metrics registry.
func (s *Server) Rejections() *limits.Rejections { return s.rejections }

// CredentialLookups is the number of credentials resolved against the
// database (or a JWT's signature) rather than answered by the caches.
func (s *Server) CredentialLookups() int64 { return s.auth.lookups.Load() }

// Handle mounts an extra handler (Socket.IO, metrics) on the server's mux.
func (s *Server) Handle(pattern string, h http.Handler) { s.routeMux().Handle(pattern, h) }

// Handler is the root handler: it resolves the client address (see
// clientaddr.Of), answers CORS for the REST API, recovers panics and turns
// routing errors into problem+json.
func (s *Server) Handler() http.Handler {
	return s.proxies.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error("panic in handler", "method", r.Method, "path", r.URL.Path, "remote", clientaddr.Of(r),
					"panic", v, "stack", string(debug.Stack()))
				writeProblem(w, Problem{Type: "/v1/problems/internal-error", Title: http.StatusText(500), Status: 500, Detail: "internal error"})
			}
		}()
		if strings.HasPrefix(r.URL.Path, "/v1/") && s.cors(w, r) {
			return
		}
		s.mux.ServeHTTP(&routingErrors{ResponseWriter: w}, r)
	}))
}

// routingErrors turns the mux's plain-text 404 and 405 answers into problems.
type routingErrors struct {
	http.ResponseWriter
	swallow bool
}

func (rw *routingErrors) WriteHeader(code int) {
	h := rw.Header()
	if (code == http.StatusNotFound || code == http.StatusMethodNotAllowed) && bytes.HasPrefix([]byte(h.Get("Content-Type")), []byte("text/plain")) {
		rw.swallow = true
		h.Del("X-Content-Type-Options")
		p := Problem{Type: "/v1/problems/not-found", Title: http.StatusText(code), Status: code, Detail: "no such endpoint"}
		if code == http.StatusMethodNotAllowed {
			p.Type, p.Detail = "/v1/problems/method-not-allowed", "method not allowed on this endpoint; allowed: "+h.Get("Allow")
		}
		writeProblem(rw.ResponseWriter, p)
		return
	}
	rw.ResponseWriter.WriteHeader(code)
}

func (rw *routingErrors) Write(b []byte) (int, error) {
	if rw.swallow {
		return len(b), nil
	}
	return rw.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the real writer (flush, hijack, deadlines).
func (rw *routingErrors) Unwrap() http.ResponseWriter { return rw.ResponseWriter }
