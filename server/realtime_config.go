package server

// The Socket.IO endpoint's configuration and its defaults.

import (
	"time"

	"github.com/zndraw/joblib/server/sio"
	"github.com/zndraw/joblib/server/sio/engineio"
)

// RealtimeConfig configures the Socket.IO endpoint (JOBLIB_-prefixed
// environment variables; see the tags).
type RealtimeConfig struct {
	// PingInterval is how often the server pings each connection.
	PingInterval time.Duration `env:"PING_INTERVAL" envDefault:"25s"`
	// PingTimeout is how long a ping may go unanswered before the
	// connection is considered dead.
	PingTimeout time.Duration `env:"PING_TIMEOUT" envDefault:"20s"`
	// DisconnectGrace is how long a worker whose socket closed keeps its
	// claims; re-joining with the same worker id within it keeps the worker.
	DisconnectGrace time.Duration `env:"DISCONNECT_GRACE" envDefault:"5s"`
	// KeepAliveInterval is how often the heartbeats of workers with an open
	// socket on this node are refreshed (one statement for all of them).
	// 0 means a third of the worker timeout, at most 10 s.
	KeepAliveInterval time.Duration `env:"SOCKET_KEEPALIVE_INTERVAL" envDefault:"0s"`
	// AllowedOrigins are the browser origins (host patterns such as
	// "app.example.com" or "*.example.com") allowed to connect; requests
	// without an Origin header (workers) are always allowed. Empty: the
	// server's Config.AllowedOrigins (the same variable).
	AllowedOrigins []string `env:"ALLOWED_ORIGINS"`
	// MaxMessageBytes caps one Socket.IO message or polling body.
	MaxMessageBytes int64 `env:"SOCKET_MAX_MESSAGE_BYTES" envDefault:"1000000"`
	// SendQueue is each connection's outbound queue in packets; a connection
	// that lets it fill is closed as a slow consumer.
	SendQueue int `env:"SOCKET_SEND_QUEUE" envDefault:"1024"`
	// ConnectTimeout closes a session that has not joined a namespace
	// (Socket.IO CONNECT) within it.
	ConnectTimeout time.Duration `env:"SOCKET_CONNECT_TIMEOUT" envDefault:"20s"`
	// MaxAttachments bounds the binary attachments of one event.
	MaxAttachments int `env:"SOCKET_MAX_ATTACHMENTS" envDefault:"64"`
	// MaxEventBytes bounds one event with its attachments, counted as they
	// arrive.
	MaxEventBytes int64 `env:"SOCKET_MAX_EVENT_BYTES" envDefault:"10000000"`
	// MaxEventDepth bounds the nesting of an event's arguments.
	MaxEventDepth int `env:"SOCKET_MAX_JSON_DEPTH" envDefault:"64"`
	// MaxRooms bounds the rooms one socket is in.
	MaxRooms int `env:"SOCKET_MAX_ROOMS" envDefault:"1000"`
	// MaxSessions and MaxSessionsPerAddr bound the open Engine.IO sessions
	// of this node, in total and per client IP address.
	MaxSessions        int `env:"SOCKET_MAX_SESSIONS" envDefault:"100000"`
	MaxSessionsPerAddr int `env:"SOCKET_MAX_SESSIONS_PER_ADDR" envDefault:"1000"`
	// MaxHints bounds the task_available / provider_request notices waiting
	// for one connection; more are dropped (the worker claims, the reader
	// retries), never disconnecting it.
	MaxHints int `env:"SOCKET_MAX_HINTS" envDefault:"32"`
	// RecoveryWindow is how long a UI that lost its connection may recover
	// it (socket.io-client ≥ 4.6 connection state recovery): same socket
	// id and rooms, and the room events it missed replayed in order. 0
	// disables recovery.
	RecoveryWindow time.Duration `env:"SOCKET_RECOVERY_WINDOW" envDefault:"2m"`
	// RecoveryMaxPackets and RecoveryMaxBytes bound what one socket may
	// have replayed; a UI that missed more gets a fresh session (and
	// refetches). RecoveryMaxPackets stays below SendQueue.
	RecoveryMaxPackets int   `env:"SOCKET_RECOVERY_MAX_PACKETS" envDefault:"1000"`
	RecoveryMaxBytes   int64 `env:"SOCKET_RECOVERY_MAX_BYTES" envDefault:"4194304"`
	// RecoveryHistoryBytes bounds the room events this node keeps to
	// replay (oldest dropped first).
	RecoveryHistoryBytes int64 `env:"SOCKET_RECOVERY_HISTORY_BYTES" envDefault:"67108864"`
}

// DefaultRealtimeConfig returns the documented defaults: the socket
// layer's own (sio and engineio Default* constants) where it has them. The
// env tags above and docs/configuration.md are checked against it
// (cmd/joblib TestDefaultsAgree).
func DefaultRealtimeConfig() RealtimeConfig {
	return RealtimeConfig{
		PingInterval: sio.DefaultPingInterval, PingTimeout: sio.DefaultPingTimeout, DisconnectGrace: 5 * time.Second,
		MaxMessageBytes: sio.DefaultMaxPayload, SendQueue: sio.DefaultSendQueue, ConnectTimeout: sio.DefaultConnectTimeout,
		MaxAttachments: sio.DefaultMaxAttachments, MaxEventBytes: sio.DefaultMaxEventBytes, MaxEventDepth: sio.DefaultMaxDepth,
		MaxRooms: sio.DefaultMaxRooms, MaxSessions: engineio.DefaultMaxSessions, MaxSessionsPerAddr: engineio.DefaultMaxSessionsPerAddr,
		MaxHints:       engineio.DefaultMaxHints,
		RecoveryWindow: 2 * time.Minute, RecoveryMaxPackets: 1000, RecoveryMaxBytes: 4 << 20, RecoveryHistoryBytes: 64 << 20,
	}
}
