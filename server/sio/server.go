package sio

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zndraw/joblib/internal/clientaddr"
	"github.com/zndraw/joblib/server/sio/engineio"
)

// Handler receives the Socket.IO life cycle of one namespace.
type Handler interface {
	// OnConnect runs when a client sends CONNECT for the namespace. req holds
	// what is kept of the HTTP request that opened the Engine.IO session: method,
	// host, remote address, path and query (up to 2 KiB) and the headers named
	// in Config.KeepHeaders; its context is not the request's, but
	// clientaddr.Of(req) is the client address of the request's. auth is the
	// CONNECT JSON payload: nil for "40" (JS client without auth), "{}" for
	// python without auth. A non-nil error refuses: the client gets
	// CONNECT_ERROR {"message": err.Error()} plus "data" if the error implements
	// interface{ Data() any }. OnConnect must answer fast: python-socketio's
	// connect() waits 1 s. Events emitted and rooms joined during OnConnect are
	// delivered after the CONNECT reply (and dropped on refusal).
	OnConnect(ctx context.Context, s *Socket, req *http.Request, auth json.RawMessage) error
	// OnEvent handles one client EVENT or BINARY_EVENT. Calls for one session
	// are sequential and in arrival order, on a goroutine of their own, so a
	// slow handler never delays heartbeats. ack is nil if the client sent no
	// ack id. ctx is the socket's context.
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

// Server is a Socket.IO v5 server on an Engine.IO v4 server (package
// engineio). Mount it at "/socket.io/".
type Server struct {
	cfg Config
	rc  RecoveryConfig // cfg.Recovery with its defaults
	eio *engineio.Server

	tr tracker // handler goroutines

	mu   sync.RWMutex
	nsps map[string]*Namespace
	main *Namespace
}

// New returns a Server whose main namespace "/" reports to h. Zero Config
// fields take their defaults.
func New(cfg Config, h Handler) *Server {
	cfg = cfg.withDefaults()
	srv := &Server{cfg: cfg, rc: cfg.Recovery.withDefaults(cfg.SendQueue), nsps: map[string]*Namespace{}}
	srv.main = srv.Of("/", h)
	srv.eio = engineio.NewServer(engineio.Config{
		PingInterval:       cfg.PingInterval,
		PingTimeout:        cfg.PingTimeout,
		MaxPayload:         cfg.MaxPayload,
		UpgradeTimeout:     cfg.UpgradeTimeout,
		SendQueue:          cfg.SendQueue,
		WriteTimeout:       cfg.WriteTimeout,
		MaxSessions:        cfg.MaxSessions,
		MaxSessionsPerAddr: cfg.MaxSessionsPerAddr,
		MaxHints:           cfg.MaxHints,
		OriginPatterns:     cfg.OriginPatterns,
		SessionID:          cfg.SessionID,
		OnReject:           cfg.OnReject,
		Logger:             cfg.Logger,
	}, engineHandler{srv})
	return srv
}

// Of registers namespace name (it must start with "/") served by h and
// returns it; registering a name again replaces its handler for sockets that
// connect afterwards. Clients connecting to a namespace that is not
// registered get CONNECT_ERROR "Invalid namespace".
func (srv *Server) Of(name string, h Handler) *Namespace {
	if !strings.HasPrefix(name, "/") {
		panic(fmt.Sprintf("sio: namespace %q must start with /", name))
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if n := srv.nsps[name]; n != nil {
		n.h.Store(&h)
		return n
	}
	n := &Namespace{name: name, srv: srv, rooms: roomTable{m: map[string]map[*Socket]struct{}{}}}
	n.h.Store(&h)
	srv.nsps[name] = n
	return n
}

// Namespace returns the registered namespace name, or nil.
func (srv *Server) Namespace(name string) *Namespace {
	srv.mu.RLock()
	defer srv.mu.RUnlock()
	return srv.nsps[name]
}

// Engine returns the Engine.IO server underneath.
func (srv *Server) Engine() *engineio.Server { return srv.eio }

// ServeHTTP answers Engine.IO requests (polling and websocket). Mount at "/socket.io/".
func (srv *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { srv.eio.ServeHTTP(w, r) }

// EmitTo sends an event to every socket of namespace "/" in room (see
// Namespace.EmitTo).
func (srv *Server) EmitTo(room, event string, args ...any) error {
	return srv.main.EmitTo(room, event, args...)
}

// EmitToAt sends a recorded broadcast to every socket of namespace "/" in
// room (see Namespace.EmitToAt).
func (srv *Server) EmitToAt(room, offset, event string, args ...any) error {
	return srv.main.EmitToAt(room, offset, event, args...)
}

// EmitHintTo sends a hint to every socket of namespace "/" in room (see
// Namespace.EmitHintTo).
func (srv *Server) EmitHintTo(room, event string, args ...any) error {
	return srv.main.EmitHintTo(room, event, args...)
}

// RoomSize returns the number of sockets of namespace "/" in room.
func (srv *Server) RoomSize(room string) int { return srv.main.RoomSize(room) }

// NumSockets returns the number of connected sockets of namespace "/"
// (OnConnect succeeded, OnDisconnect not yet called).
func (srv *Server) NumSockets() int { return srv.main.NumSockets() }

// Shutdown stops accepting sessions, closes every session (OnDisconnect gets
// "server shutting down"; websocket clients see close code 1001, a pending
// poll gets a close packet) and waits until every goroutine of the server has
// exited, including running handler calls. If ctx ends first, every remaining
// connection is torn down without a close handshake, Shutdown waits for the
// goroutines that this unblocks, and returns ctx's error. Safe to call more
// than once.
func (srv *Server) Shutdown(ctx context.Context) error {
	err := srv.eio.Shutdown(ctx)
	if werr := srv.tr.wait(ctx); err == nil {
		err = werr
	}
	if err != nil {
		_ = srv.tr.wait(context.WithoutCancel(ctx))
	}
	return err
}

// goroutines counts the goroutines of both layers.
func (srv *Server) goroutines() int { return srv.tr.count() + srv.eio.Goroutines() }

// Rooms lists the rooms of the main namespace that have members on this
// server.
func (srv *Server) Rooms() []string { return srv.main.Rooms() }

// Namespace is one Socket.IO namespace: its handler, sockets and rooms.
type Namespace struct {
	name     string
	srv      *Server
	h        atomic.Pointer[Handler]
	rooms    roomTable
	nsockets atomic.Int64
	hist     history // recorded broadcasts (connection state recovery)
}

// Name returns the namespace's name ("/", "/admin", ...).
func (n *Namespace) Name() string { return n.name }

func (n *Namespace) handler() Handler { return *n.h.Load() }

// EmitTo sends an event to every socket of the namespace in room. It encodes
// the packet once and queues the same bytes for each member without
// blocking; a member whose queue is full is closed as a slow consumer and the
// others are unaffected. It returns an error only for a reserved event name
// or arguments that cannot be encoded.
func (n *Namespace) EmitTo(room, event string, args ...any) error {
	m, err := encodeEvent(n.name, event, args, 0, false)
	if err != nil {
		return err
	}
	members := n.rooms.snapshot(room)
	for _, sock := range *members {
		_ = sock.queue(m)
	}
	for _, sock := range *members {
		sock.c.conn.Flush()
	}
	n.rooms.release(members)
	return nil
}

// EmitHintTo sends an event that its receivers can do without, such as a
// "there is work" notice that the receiver also learns by polling: for each
// member it is dropped rather than queued when the same packet is already
// waiting, when too many hints are waiting, or when the member's queue is
// half full. A hint never closes a socket as a slow consumer.
func (n *Namespace) EmitHintTo(room, event string, args ...any) error {
	m, err := encodeEvent(n.name, event, args, 0, false)
	if err != nil {
		return err
	}
	members := n.rooms.snapshot(room)
	for _, sock := range *members {
		sock.hint(m)
	}
	n.rooms.release(members)
	return nil
}

// RoomSize returns the number of sockets of the namespace in room.
func (n *Namespace) RoomSize(room string) int { return n.rooms.size(room) }

// Rooms lists the namespace's rooms that have members.
func (n *Namespace) Rooms() []string {
	n.rooms.mu.RLock()
	defer n.rooms.mu.RUnlock()
	out := make([]string, 0, len(n.rooms.m))
	for r := range n.rooms.m {
		out = append(out, r)
	}
	return out
}

// NumSockets returns the number of connected sockets of the namespace.
func (n *Namespace) NumSockets() int { return int(n.nsockets.Load()) }

// engineHandler connects the Engine.IO sessions to their Socket.IO clients.
type engineHandler struct{ srv *Server }

func (e engineHandler) OnOpen(conn *engineio.Conn, r *http.Request) error {
	c := &client{srv: e.srv, conn: conn, hs: keepHandshake(r, e.srv.cfg.KeepHeaders)}
	conn.SetData(c)
	c.mu.Lock()
	c.connectTimer = time.AfterFunc(e.srv.cfg.ConnectTimeout, c.connectTimedOut)
	c.mu.Unlock()
	return nil
}

func (e engineHandler) OnMessage(conn *engineio.Conn, data []byte, binary bool) {
	c, _ := conn.Data().(*client)
	if c == nil {
		return
	}
	var err error
	if binary {
		err = c.onAttachment(data)
	} else {
		err = c.onSIO(data)
	}
	if err != nil {
		c.closeFor(err)
	}
}

func (e engineHandler) OnClose(conn *engineio.Conn, reason string) {
	if c, _ := conn.Data().(*client); c != nil {
		c.closed(reason)
	}
}

// handshake is what Handler.OnConnect may need of the request that opened
// the session; the session does not keep the request (nor most of its
// headers) for its lifetime.
type handshake struct {
	method, proto, host, remote, path, query string
	client                                   string   // clientaddr.Of the request
	headers                                  []string // name, value, name, value...
}

func keepHandshake(r *http.Request, keep []string) *handshake {
	h := &handshake{
		method: r.Method, proto: r.Proto, host: strings.Clone(r.Host), remote: strings.Clone(r.RemoteAddr),
		client: strings.Clone(clientaddr.Of(r)), path: strings.Clone(r.URL.Path),
	}
	if len(r.URL.RawQuery) <= 2048 {
		h.query = strings.Clone(r.URL.RawQuery)
	}
	for _, k := range keep {
		vs := r.Header.Values(k)
		size := 0
		for _, v := range vs {
			size += len(v)
		}
		if size > maxKeptHeaderBytes {
			continue
		}
		for _, v := range vs {
			h.headers = append(h.headers, http.CanonicalHeaderKey(k), strings.Clone(v))
		}
	}
	return h
}

// request rebuilds a request for OnConnect (a fresh copy for each call).
func (h *handshake) request() *http.Request {
	r := &http.Request{
		Method: h.method, Proto: h.proto, Host: h.host, RemoteAddr: h.remote,
		URL: &url.URL{Path: h.path, RawQuery: h.query}, Header: make(http.Header, len(h.headers)/2),
	}
	r.ProtoMajor, r.ProtoMinor, _ = http.ParseHTTPVersion(h.proto)
	for i := 0; i+1 < len(h.headers); i += 2 {
		r.Header[h.headers[i]] = append(r.Header[h.headers[i]], h.headers[i+1])
	}
	return r.WithContext(clientaddr.NewContext(context.Background(), h.client))
}

// tracker counts handler goroutines so that Shutdown can wait for them.
type tracker struct {
	mu   sync.Mutex
	n    int
	zero chan struct{}
}

func (t *tracker) add() {
	t.mu.Lock()
	if t.n == 0 {
		t.zero = make(chan struct{})
	}
	t.n++
	t.mu.Unlock()
}

func (t *tracker) done() {
	t.mu.Lock()
	t.n--
	if t.n == 0 {
		close(t.zero)
	}
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
