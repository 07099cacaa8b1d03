package sio

import (
	"cmp"
	"log/slog"
	"time"

	"github.com/zndraw/joblib/server/sio/engineio"
)

// Defaults applied by New to zero Config fields; the transport's are the
// engineio package's (one source each). joblib's server.DefaultRealtimeConfig
// is built from these.
const (
	DefaultPingInterval = engineio.DefaultPingInterval
	DefaultPingTimeout  = engineio.DefaultPingTimeout
	DefaultMaxPayload   = engineio.DefaultMaxPayload
	// DefaultConnectTimeout is 20 s: socket.io-client sends its CONNECT
	// right after the Engine.IO handshake and abandons an attempt that has
	// not connected within its own 20 s timeout, so a session without a
	// CONNECT by then has no client waiting for it. (The Node server's
	// default is 45 s; joblib's JOBLIB_SOCKET_CONNECT_TIMEOUT was 20 s.)
	DefaultConnectTimeout = 20 * time.Second
	DefaultUpgradeTimeout = engineio.DefaultUpgradeTimeout
	DefaultSendQueue      = engineio.DefaultSendQueue
	DefaultWriteTimeout   = engineio.DefaultWriteTimeout
	DefaultMaxAttachments = 64
	DefaultMaxEventBytes  = 10_000_000
	DefaultMaxDepth       = 64
	DefaultMaxRooms       = 1000
)

// DefaultKeepHeaders are the handshake headers kept for Handler.OnConnect.
var DefaultKeepHeaders = []string{"Authorization", "Cookie", "Origin", "User-Agent", "X-Forwarded-For"}

// maxKeptHeaderBytes bounds each kept header value; longer values are dropped.
const maxKeptHeaderBytes = 8 << 10

// Config tunes a Server. The zero value is usable: every zero field takes its
// Default* value.
type Config struct {
	// PingInterval is how often the server pings every session (default 25s).
	PingInterval time.Duration
	// PingTimeout is how long a ping may stay unanswered before the session is
	// closed with reason "ping timeout" (default 20s).
	PingTimeout time.Duration
	// MaxPayload bounds one websocket message and one polling POST body, in bytes
	// (default 1_000_000). Past it the session closes with "payload too large".
	MaxPayload int64
	// ConnectTimeout closes an Engine.IO session that is in no namespace
	// within this time of opening (or of leaving its last one) (DefaultConnectTimeout).
	ConnectTimeout time.Duration
	// UpgradeTimeout bounds a polling→websocket upgrade (default 10s).
	UpgradeTimeout time.Duration
	// SendQueue bounds the outbound queue of one session, in Socket.IO packets
	// (an event and its binary attachments count once) (default 1024). A full
	// queue closes that session with reason "slow consumer" (close code 4008);
	// nobody else waits. It also bounds the inbound events waiting for
	// Handler.OnEvent (reason "event queue full" when exceeded).
	SendQueue int
	// WriteTimeout bounds a stuck websocket write (default 10s; checked at
	// every heartbeat).
	WriteTimeout time.Duration
	// OriginPatterns lists the browser origins allowed besides the request's own
	// host (see engineio.Config.OriginPatterns).
	OriginPatterns []string

	// MaxAttachments bounds the binary attachments one packet may announce
	// (default 64).
	MaxAttachments int
	// MaxEventBytes bounds one packet with all its attachments, counted as they
	// arrive (default 10_000_000). Attachments past it are discarded, not kept.
	MaxEventBytes int64
	// MaxDepth bounds how deeply arrays and objects nest in an event's
	// arguments (default 64), checked in one pass before anything else reads
	// them.
	MaxDepth int
	// MaxRooms bounds the rooms one socket is in, its own room included
	// (default 1000); Socket.Join returns ErrTooManyRooms past it.
	MaxRooms int
	// MaxSessions and MaxSessionsPerAddr bound the Engine.IO sessions in total
	// and per remote IP (defaults: engineio.DefaultMaxSessions and
	// engineio.DefaultMaxSessionsPerAddr).
	MaxSessions        int
	MaxSessionsPerAddr int
	// MaxHints bounds the hints (Socket.EmitHint, Namespace.EmitHintTo)
	// waiting for one session (default engineio.DefaultMaxHints).
	MaxHints int
	// SessionID generates Engine.IO session ids (see engineio.Config.SessionID).
	SessionID func() string
	// KeepHeaders lists the handshake headers kept for Handler.OnConnect
	// (default DefaultKeepHeaders); values over 8 KiB are dropped. The rest of
	// the handshake request is not kept.
	KeepHeaders []string
	// RejectAck, if set, answers a packet that asked for an ack and exceeded
	// a budget (attachments, event bytes, depth): the ack carries its
	// result instead of the session being closed. Without it, or without an
	// ack id, the session is closed with the budget's reason.
	RejectAck func(limit string) []any
	// OnReject, if set, is called with the budget's name for every refusal
	// (see the Limit* constants and engineio's). It must not block.
	OnReject func(limit string)
	// Logger receives connection-level diagnostics (default: discard).
	Logger *slog.Logger
	// Recovery enables connection state recovery (see RecoveryConfig; the
	// zero value leaves it off).
	Recovery RecoveryConfig
}

// Budget names passed to Config.OnReject by this package.
const (
	LimitAttachments = "socket_attachments"
	LimitEventBytes  = "socket_event_bytes"
	LimitDepth       = "socket_json_depth"
	LimitRooms       = "socket_rooms"
	LimitConnect     = "socket_connect_timeout"
)

func (c Config) withDefaults() Config {
	c.PingInterval = cmp.Or(c.PingInterval, DefaultPingInterval)
	c.PingTimeout = cmp.Or(c.PingTimeout, DefaultPingTimeout)
	c.MaxPayload = cmp.Or(c.MaxPayload, DefaultMaxPayload)
	c.ConnectTimeout = cmp.Or(c.ConnectTimeout, DefaultConnectTimeout)
	c.UpgradeTimeout = cmp.Or(c.UpgradeTimeout, DefaultUpgradeTimeout)
	c.SendQueue = cmp.Or(c.SendQueue, DefaultSendQueue)
	c.WriteTimeout = cmp.Or(c.WriteTimeout, DefaultWriteTimeout)
	c.MaxAttachments = cmp.Or(c.MaxAttachments, DefaultMaxAttachments)
	c.MaxEventBytes = cmp.Or(c.MaxEventBytes, DefaultMaxEventBytes)
	c.MaxDepth = cmp.Or(c.MaxDepth, DefaultMaxDepth)
	c.MaxRooms = cmp.Or(c.MaxRooms, DefaultMaxRooms)
	if c.KeepHeaders == nil {
		c.KeepHeaders = DefaultKeepHeaders
	}
	if c.OnReject == nil {
		c.OnReject = func(string) {}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}
