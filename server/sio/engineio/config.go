package engineio

import (
	"cmp"
	"crypto/rand"
	"encoding/base64"
	"log/slog"
	"time"
)

// Defaults applied by NewServer to zero Config fields.
const (
	DefaultPingInterval       = 25 * time.Second
	DefaultPingTimeout        = 20 * time.Second
	DefaultMaxPayload         = 1_000_000
	DefaultUpgradeTimeout     = 10 * time.Second
	DefaultSendQueue          = 1024
	DefaultWriteTimeout       = 10 * time.Second
	DefaultMaxSessions        = 100_000
	DefaultMaxSessionsPerAddr = 1_000
	DefaultMaxHints           = 32
)

// Config tunes a Server. The zero value is usable: every zero field takes its
// Default* value.
type Config struct {
	// PingInterval is how often the server pings every session (default 25s).
	// The next ping is scheduled PingInterval after the previous pong.
	PingInterval time.Duration
	// PingTimeout is how long a ping may stay unanswered before the session is
	// closed with reason "ping timeout" (default 20s).
	PingTimeout time.Duration
	// MaxPayload bounds one websocket message and one polling POST body, in
	// bytes (default 1_000_000). Bigger websocket messages close the session
	// (close code 1009); bigger POST bodies are answered 413 and close it.
	MaxPayload int64
	// UpgradeTimeout bounds a polling→websocket upgrade from the websocket
	// handshake to the client's upgrade packet (default 10s). On expiry the
	// probe websocket is closed and the session keeps polling.
	UpgradeTimeout time.Duration
	// SendQueue bounds the outbound queue of one session, in messages (a
	// message and the binary messages sent with it count once) (default 1024).
	// A full queue closes that session with reason "slow consumer".
	SendQueue int
	// WriteTimeout bounds how long one websocket write may block (default
	// 10s). It is checked at every heartbeat, so a stuck write is detected
	// within WriteTimeout plus one PingInterval; the session is then closed
	// with reason "transport error".
	WriteTimeout time.Duration
	// MaxSessions bounds the open sessions of the server (default 100_000);
	// a handshake past it is answered 503.
	MaxSessions int
	// MaxSessionsPerAddr bounds the open sessions of one client address
	// (clientaddr.Of: the TCP peer, or behind a trusted reverse proxy the
	// client it names; default 1_000); a handshake past it is answered 429.
	MaxSessionsPerAddr int
	// MaxHints bounds the hints (Conn.SendHint) waiting in one session's
	// queue (default 32); further hints are dropped, never closing the session.
	MaxHints int
	// OriginPatterns lists the browser origins allowed besides the request's
	// own host, as host patterns ("app.example.com", "*.example.com") or
	// full-origin patterns containing "://" (path.Match syntax,
	// case-insensitive). Requests without an Origin header are always
	// allowed; other origins get 403.
	OriginPatterns []string
	// SessionID generates session ids (default: 20 random URL-safe base64
	// characters). An id is a bearer secret for polling requests: it must be
	// unguessable and unique among the open sessions. A cluster may embed a
	// node identifier in it to route polling requests to their node.
	SessionID func() string
	// OnReject, if set, is called with the name of the budget whenever a
	// request or session is refused for exceeding one ("sessions",
	// "sessions_per_addr", "payload_bytes"). It must not block.
	OnReject func(limit string)
	// Logger receives connection-level diagnostics (default: discard).
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	c.PingInterval = cmp.Or(c.PingInterval, DefaultPingInterval)
	c.PingTimeout = cmp.Or(c.PingTimeout, DefaultPingTimeout)
	c.MaxPayload = cmp.Or(c.MaxPayload, DefaultMaxPayload)
	c.UpgradeTimeout = cmp.Or(c.UpgradeTimeout, DefaultUpgradeTimeout)
	c.SendQueue = cmp.Or(c.SendQueue, DefaultSendQueue)
	c.WriteTimeout = cmp.Or(c.WriteTimeout, DefaultWriteTimeout)
	c.MaxSessions = cmp.Or(c.MaxSessions, DefaultMaxSessions)
	c.MaxSessionsPerAddr = cmp.Or(c.MaxSessionsPerAddr, DefaultMaxSessionsPerAddr)
	c.MaxHints = cmp.Or(c.MaxHints, DefaultMaxHints)
	if c.SessionID == nil {
		c.SessionID = RandomID
	}
	if c.OnReject == nil {
		c.OnReject = func(string) {}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// RandomID returns 20 URL-safe base64 characters (120 random bits): the
// default session id.
func RandomID() string {
	var b [15]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// Budget names passed to Config.OnReject.
const (
	LimitSessions        = "sessions"
	LimitSessionsPerAddr = "sessions_per_addr"
	LimitPayloadBytes    = "payload_bytes"
)
