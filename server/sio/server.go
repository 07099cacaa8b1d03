package sio

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/coder/websocket"
)

// Handler receives the Socket.IO life cycle of namespace "/".
type Handler interface {
	// OnConnect runs when a client sends CONNECT for namespace "/". req is the HTTP
	// request that opened the Engine.IO session (headers, cookies, query; its
	// context is detached from the request's cancellation). auth is the CONNECT
	// JSON payload: nil for "40" (JS client without auth), "{}" for python without
	// auth. A non-nil error refuses: the client gets CONNECT_ERROR
	// {"message": err.Error()} plus "data" if the error implements
	// interface{ Data() any }. OnConnect must answer fast: python-socketio's
	// connect() waits 1 s. Events emitted and rooms joined during OnConnect are
	// delivered after the CONNECT reply (and dropped on refusal).
	OnConnect(ctx context.Context, s *Socket, req *http.Request, auth json.RawMessage) error
	// OnEvent handles one client EVENT or BINARY_EVENT. Calls for one socket are
	// sequential and in arrival order, on a goroutine of their own, so a slow
	// handler never delays heartbeats. ack is nil if the client sent no ack id.
	// ctx is the socket's context.
	OnEvent(ctx context.Context, s *Socket, ev Event, ack AckFunc)
	// OnDisconnect is called exactly once for every socket whose OnConnect
	// succeeded, after any OnEvent call for that socket has returned, with one of
	// the Reason* constants (or the text given to Socket.Close).
	OnDisconnect(s *Socket, reason string)
}

// Event is one event received from a client.
type Event struct {
	// Name is the event name (never a reserved name).
	Name string
	// Args are the arguments as received. In a binary event, placeholders
	// {"_placeholder":true,"num":k} stay in place; see wire.InlineAttachments and
	// wire.Reconstruct.
	Args []json.RawMessage
	// Attachments holds the binary attachments in placeholder (num) order.
	Attachments [][]byte
}

// AckFunc answers an event's acknowledgement. []byte arguments (at the top level
// or inside []any / map[string]any) become binary attachments (BINARY_ACK); other
// arguments are JSON-encoded. Only the first call sends; later calls return
// ErrAckSent.
type AckFunc func(args ...any) error

// Server is an Engine.IO v4 / Socket.IO v5 server for namespace "/". Mount it at
// "/socket.io/".
type Server struct {
	cfg        Config
	h          Handler
	acceptOpts *websocket.AcceptOptions

	ctx    context.Context // parent of every socket context; cancelled by Shutdown
	cancel context.CancelFunc

	tr tracker

	mu       sync.Mutex
	sessions map[string]*session
	closed   bool

	rooms    roomTable
	nsockets atomic.Int64
}

// New returns a Server that reports to h. Zero Config fields take their defaults.
func New(cfg Config, h Handler) *Server {
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{
		cfg:        cfg,
		h:          h,
		acceptOpts: &websocket.AcceptOptions{OriginPatterns: cfg.OriginPatterns},
		ctx:        ctx,
		cancel:     cancel,
		sessions:   make(map[string]*session),
		rooms:      roomTable{m: make(map[string]map[*Socket]struct{})},
	}
}

// Engine.IO error codes for HTTP 400 bodies.
const (
	codeTransportUnknown   = 0
	codeUnknownSID         = 1
	codeBadHandshakeMethod = 2
	codeBadRequest         = 3
	codeForbidden          = 4
	codeUnsupportedVersion = 5
)

var codeMessages = map[int]string{
	codeTransportUnknown:   "Transport unknown",
	codeUnknownSID:         "Session ID unknown",
	codeBadHandshakeMethod: "Bad handshake method",
	codeBadRequest:         "Bad request",
	codeForbidden:          "Forbidden",
	codeUnsupportedVersion: "Unsupported protocol version",
}

func writeError(w http.ResponseWriter, status, code int) {
	body, _ := json.Marshal(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{code, codeMessages[code]})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// ServeHTTP answers Engine.IO requests (polling and websocket). Mount at "/socket.io/".
func (srv *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	transport := q.Get("transport")
	if r.Header.Get("Origin") != "" {
		if !srv.originAllowed(r) {
			writeError(w, http.StatusForbidden, codeForbidden)
			return
		}
		if transport != "websocket" {
			h := w.Header()
			h.Set("Access-Control-Allow-Origin", r.Header.Get("Origin"))
			h.Set("Access-Control-Allow-Credentials", "true")
			h.Add("Vary", "Origin")
		}
	}
	if r.Method == http.MethodOptions {
		h := w.Header()
		h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
		if req := r.Header.Get("Access-Control-Request-Headers"); req != "" {
			h.Set("Access-Control-Allow-Headers", req)
		}
		h.Set("Access-Control-Max-Age", "86400")
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if q.Get("EIO") != "4" {
		writeError(w, http.StatusBadRequest, codeUnsupportedVersion)
		return
	}
	sid := q.Get("sid")
	switch transport {
	case transportWebSocket:
		if r.Method != http.MethodGet {
			writeError(w, http.StatusBadRequest, codeBadHandshakeMethod)
			return
		}
		if sid == "" {
			srv.serveWebSocket(w, r)
		} else {
			srv.serveUpgrade(w, r, sid)
		}
	case transportPolling:
		if sid == "" {
			if r.Method != http.MethodGet {
				writeError(w, http.StatusBadRequest, codeBadHandshakeMethod)
				return
			}
			srv.servePollingHandshake(w, r)
			return
		}
		s := srv.lookup(sid)
		if s == nil {
			writeError(w, http.StatusBadRequest, codeUnknownSID)
			return
		}
		switch r.Method {
		case http.MethodGet:
			s.servePoll(w, r)
		case http.MethodPost:
			s.servePost(w, r)
		default:
			writeError(w, http.StatusBadRequest, codeBadRequest)
		}
	default:
		writeError(w, http.StatusBadRequest, codeTransportUnknown)
	}
}

// originAllowed applies the same rule as websocket.Accept: same host as the
// request, or a match in OriginPatterns.
func (srv *Server) originAllowed(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	if strings.EqualFold(u.Host, r.Host) {
		return true
	}
	for _, p := range srv.cfg.OriginPatterns {
		target := u.Host
		if strings.Contains(p, "://") {
			target = origin
		}
		if ok, _ := path.Match(strings.ToLower(p), strings.ToLower(target)); ok {
			return true
		}
	}
	return false
}

func randomID() string {
	var b [15]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// newSession registers a session, or returns nil once Shutdown has begun.
func (srv *Server) newSession(r *http.Request, transport string) *session {
	s := newSession(srv, r, transport)
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.closed {
		return nil
	}
	srv.sessions[s.sid] = s
	return s
}

func (srv *Server) lookup(sid string) *session {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return srv.sessions[sid]
}

func (srv *Server) removeSession(s *session) {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.sessions[s.sid] == s {
		delete(srv.sessions, s.sid)
	}
}

// EmitTo sends an event to every socket in room. It encodes the packet once and
// enqueues it without blocking; a socket whose queue is full is closed as a slow
// consumer and the others are unaffected. It returns an error only for a
// reserved event name or arguments that cannot be encoded.
func (srv *Server) EmitTo(room, event string, args ...any) error {
	m, err := encodeEvent(event, args, 0, false)
	if err != nil {
		return err
	}
	members := srv.rooms.snapshot(room)
	for _, sock := range *members {
		_ = sock.sendQuiet(m)
	}
	for _, sock := range *members {
		sock.sess.q.signal()
	}
	srv.rooms.release(members)
	return nil
}

// RoomSize returns the number of sockets in room.
func (srv *Server) RoomSize(room string) int { return srv.rooms.size(room) }

// Rooms lists the rooms that have members on this server.
func (srv *Server) Rooms() []string {
	srv.rooms.mu.RLock()
	defer srv.rooms.mu.RUnlock()
	out := make([]string, 0, len(srv.rooms.m))
	for r := range srv.rooms.m {
		out = append(out, r)
	}
	return out
}

// NumSockets returns the number of connected sockets (OnConnect succeeded,
// OnDisconnect not yet called).
func (srv *Server) NumSockets() int { return int(srv.nsockets.Load()) }

// Shutdown stops accepting sessions, closes every session (OnDisconnect gets
// "server shutting down"; websocket clients see close code 1001, a pending poll
// gets a close packet) and waits until every goroutine of the server has
// exited, including running handler calls. If ctx ends first, every remaining
// connection is torn down without a close handshake, Shutdown waits for the
// goroutines that this unblocks, and returns ctx's error. Safe to call more than once.
func (srv *Server) Shutdown(ctx context.Context) error {
	srv.mu.Lock()
	srv.closed = true
	sessions := make([]*session, 0, len(srv.sessions))
	for _, s := range srv.sessions {
		sessions = append(sessions, s)
	}
	srv.sessions = make(map[string]*session)
	srv.mu.Unlock()
	srv.tr.stop()

	for _, s := range sessions {
		s.close(ReasonServerShutdown, false)
	}
	err := srv.tr.wait(ctx)
	if err != nil {
		for _, s := range sessions {
			s.abort()
		}
		_ = srv.tr.wait(context.WithoutCancel(ctx))
	}
	srv.cancel()
	return err
}

// tracker counts the server's goroutines so that Shutdown can wait for them.
type tracker struct {
	mu      sync.Mutex
	n       int
	stopped bool
	zero    chan struct{}
}

// start counts a new root goroutine (a websocket handler); false after stop.
func (t *tracker) start() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return false
	}
	t.addLocked()
	return true
}

// add counts a goroutine started by an already counted one (or by a close).
func (t *tracker) add() {
	t.mu.Lock()
	t.addLocked()
	t.mu.Unlock()
}

func (t *tracker) addLocked() {
	if t.n == 0 {
		t.zero = make(chan struct{})
	}
	t.n++
}

func (t *tracker) done() {
	t.mu.Lock()
	t.n--
	if t.n == 0 {
		close(t.zero)
	}
	t.mu.Unlock()
}

func (t *tracker) stop() {
	t.mu.Lock()
	t.stopped = true
	t.mu.Unlock()
}

func (t *tracker) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

func (t *tracker) wait(ctx context.Context) error {
	for {
		t.mu.Lock()
		if t.n == 0 {
			t.mu.Unlock()
			return nil
		}
		zero := t.zero
		t.mu.Unlock()
		select {
		case <-zero:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
