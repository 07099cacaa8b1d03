package engineio

import (
	"encoding/json"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/coder/websocket"
	"github.com/zndraw/joblib/internal/clientaddr"
)

// Handler receives the life cycle of every session.
type Handler interface {
	// OnOpen runs when a session opens, before the client gets the open
	// packet. r is the handshake request: it is valid during the call only
	// (copy what is needed; the session does not keep it). A non-nil error
	// refuses the session with HTTP 403.
	OnOpen(c *Conn, r *http.Request) error
	// OnMessage receives one message: text (binary false) or binary. Calls
	// for one session are sequential, in arrival order, on the transport's
	// reader: they must not block (hand long work to another goroutine). data
	// belongs to the handler.
	OnMessage(c *Conn, data []byte, binary bool)
	// OnClose is called exactly once for every session whose OnOpen
	// succeeded, with the reason it closed. An OnMessage call in progress may
	// still be running; none starts afterwards.
	OnClose(c *Conn, reason string)
}

// Server is an Engine.IO v4 server. Mount it at "/engine.io/" (or, under
// Socket.IO, "/socket.io/").
type Server struct {
	cfg        Config
	h          Handler
	acceptOpts *websocket.AcceptOptions

	tr tracker
	// writers counts the writer goroutines started (tests: a direct write
	// starts none).
	writers atomic.Uint64

	mu       sync.Mutex
	sessions map[string]*Conn
	perAddr  map[string]int
	closed   bool
}

// NewServer returns a Server that reports to h. Zero Config fields take
// their defaults.
func NewServer(cfg Config, h Handler) *Server {
	cfg = cfg.withDefaults()
	return &Server{
		cfg:        cfg,
		h:          h,
		acceptOpts: &websocket.AcceptOptions{OriginPatterns: cfg.OriginPatterns},
		sessions:   make(map[string]*Conn),
		perAddr:    make(map[string]int),
	}
}

// Config returns the configuration in force (defaults applied).
func (srv *Server) Config() Config { return srv.cfg }

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
	writeErrorMessage(w, status, code, codeMessages[code])
}

func writeErrorMessage(w http.ResponseWriter, status, code int, msg string) {
	body, _ := json.Marshal(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{code, msg})
	if status == http.StatusTooManyRequests {
		// Every 429 says when to come back.
		w.Header().Set("Retry-After", "1")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// ServeHTTP answers Engine.IO requests (polling and websocket).
func (srv *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	transport := q.Get("transport")
	if r.Header.Get("Origin") != "" {
		if !srv.originAllowed(r) {
			// Logged: a browser refused for its origin otherwise only sees a
			// CORS failure, and the operator nothing at all.
			srv.cfg.Logger.Warn("socket refused: origin not allowed", "origin", r.Header.Get("Origin"), "host", r.Host,
				"transport", transport, "remote", clientaddr.Of(r))
			writeError(w, http.StatusForbidden, codeForbidden)
			return
		}
		if transport != WebSocket {
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
	case WebSocket:
		if r.Method != http.MethodGet {
			writeError(w, http.StatusBadRequest, codeBadHandshakeMethod)
			return
		}
		if sid == "" {
			srv.serveWebSocket(w, r)
		} else {
			srv.serveUpgrade(w, r, sid)
		}
	case Polling:
		if sid == "" {
			if r.Method != http.MethodGet {
				writeError(w, http.StatusBadRequest, codeBadHandshakeMethod)
				return
			}
			srv.servePollingHandshake(w, r)
			return
		}
		c := srv.Lookup(sid)
		if c == nil {
			writeError(w, http.StatusBadRequest, codeUnknownSID)
			return
		}
		switch r.Method {
		case http.MethodGet:
			c.servePoll(w, r)
		case http.MethodPost:
			c.servePost(w, r)
		default:
			writeError(w, http.StatusBadRequest, codeBadRequest)
		}
	default:
		writeError(w, http.StatusBadRequest, codeTransportUnknown)
	}
}

// originAllowed applies the rule of websocket.Accept: same host as the
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

// open creates and registers a session within the session budgets and runs
// Handler.OnOpen. On refusal it has answered w and returns nil.
func (srv *Server) open(w http.ResponseWriter, r *http.Request, transport string) *Conn {
	c := &Conn{srv: srv, addr: clientaddr.Of(r), transport: transport}
	c.q.max = srv.cfg.SendQueue
	if transport == Polling {
		c.wake = make(chan struct{}, 1)
	}
	srv.mu.Lock()
	switch {
	case srv.closed:
		srv.mu.Unlock()
		writeErrorMessage(w, http.StatusServiceUnavailable, codeBadRequest, "Server shutting down")
		return nil
	case len(srv.sessions) >= srv.cfg.MaxSessions:
		srv.mu.Unlock()
		srv.cfg.OnReject(LimitSessions)
		writeErrorMessage(w, http.StatusServiceUnavailable, codeBadRequest, "Too many sessions")
		return nil
	case srv.perAddr[c.addr] >= srv.cfg.MaxSessionsPerAddr:
		srv.mu.Unlock()
		srv.cfg.OnReject(LimitSessionsPerAddr)
		writeErrorMessage(w, http.StatusTooManyRequests, codeBadRequest, "Too many sessions from this address")
		return nil
	}
	for {
		c.id = srv.cfg.SessionID()
		if _, taken := srv.sessions[c.id]; !taken && c.id != "" {
			break
		}
	}
	srv.sessions[c.id] = c
	srv.perAddr[c.addr]++
	srv.mu.Unlock()
	if transport == WebSocket {
		// The open packet goes first, before anything OnOpen sends.
		c.q.items = append(c.q.items, c.openPacket())
	}
	if err := srv.h.OnOpen(c, r); err != nil {
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
		srv.remove(c)
		writeErrorMessage(w, http.StatusForbidden, codeForbidden, err.Error())
		return nil
	}
	return c
}

// Lookup returns the open session with id sid, or nil.
func (srv *Server) Lookup(sid string) *Conn {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return srv.sessions[sid]
}

func (srv *Server) remove(c *Conn) {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.sessions[c.id] != c {
		return
	}
	delete(srv.sessions, c.id)
	if n := srv.perAddr[c.addr] - 1; n > 0 {
		srv.perAddr[c.addr] = n
	} else {
		delete(srv.perAddr, c.addr)
	}
}

// NumSessions returns the number of open sessions.
func (srv *Server) NumSessions() int {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return len(srv.sessions)
}

// Goroutines returns the number of goroutines the server is running
// (websocket readers and writers, upgrades in progress).
func (srv *Server) Goroutines() int { return srv.tr.count() }
