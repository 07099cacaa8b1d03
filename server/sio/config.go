package sio

import (
	"cmp"
	"log/slog"
	"time"
)

// Defaults applied by New to zero Config fields.
const (
	DefaultPingInterval   = 25 * time.Second
	DefaultPingTimeout    = 20 * time.Second
	DefaultMaxPayload     = 1_000_000
	DefaultConnectTimeout = 45 * time.Second
	DefaultUpgradeTimeout = 10 * time.Second
	DefaultSendQueue      = 1024
	DefaultWriteTimeout   = 10 * time.Second
)

// Config tunes a Server. The zero value is usable: every zero field takes its
// Default* value.
type Config struct {
	// PingInterval is how often the server pings every session (default 25s). The
	// next ping is scheduled PingInterval after the previous pong, whatever other
	// traffic flows: socket.io-client only re-arms its own timer on pings.
	PingInterval time.Duration
	// PingTimeout is how long a ping may stay unanswered before the session is
	// closed with reason "ping timeout" (default 20s).
	PingTimeout time.Duration
	// MaxPayload bounds one websocket message and one polling POST body, in bytes
	// (default 1_000_000). Bigger websocket messages close the session (close code
	// 1009); bigger POST bodies are answered 413 and close the session. Both use
	// reason "payload too large".
	MaxPayload int64
	// ConnectTimeout closes an Engine.IO session that has not joined namespace "/"
	// within this time of opening (or of leaving it) (default 45s).
	ConnectTimeout time.Duration
	// UpgradeTimeout bounds a polling→websocket upgrade from the websocket
	// handshake to the client's upgrade packet (default 10s). On expiry the probe
	// websocket is closed and the session keeps polling.
	UpgradeTimeout time.Duration
	// SendQueue bounds the outbound queue of one connection, in Socket.IO packets
	// (an event and its binary attachments count once) (default 1024). A full
	// queue closes that connection with reason "slow consumer" (websocket close
	// code 4008); nobody else waits. It also bounds the inbound events waiting for
	// Handler.OnEvent (reason "event queue full" when exceeded).
	SendQueue int
	// WriteTimeout bounds every websocket frame write (default 10s); an expired
	// write closes the session with reason "transport error".
	WriteTimeout time.Duration
	// OriginPatterns lists the browser origins allowed besides the request's own
	// host, as host patterns ("app.example.com", "*.example.com") or full-origin
	// patterns containing "://" (path.Match syntax, case-insensitive). It is passed
	// to websocket.AcceptOptions.OriginPatterns and is the CORS allow-list for
	// polling. Requests without an Origin header are always allowed; other
	// origins get 403.
	OriginPatterns []string
	// Logger receives connection-level diagnostics (default: discard).
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	c.PingInterval = cmp.Or(c.PingInterval, DefaultPingInterval)
	c.PingTimeout = cmp.Or(c.PingTimeout, DefaultPingTimeout)
	c.MaxPayload = cmp.Or(c.MaxPayload, DefaultMaxPayload)
	c.ConnectTimeout = cmp.Or(c.ConnectTimeout, DefaultConnectTimeout)
	c.UpgradeTimeout = cmp.Or(c.UpgradeTimeout, DefaultUpgradeTimeout)
	c.SendQueue = cmp.Or(c.SendQueue, DefaultSendQueue)
	c.WriteTimeout = cmp.Or(c.WriteTimeout, DefaultWriteTimeout)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}
