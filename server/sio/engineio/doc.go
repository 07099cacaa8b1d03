// Package engineio is an Engine.IO v4 server: sessions over HTTP
// long-polling and websocket (github.com/coder/websocket), the upgrade from
// one to the other, heartbeats, and raw text and binary messages. It knows
// nothing of Socket.IO, which package sio builds on top of it, and can be
// used on its own by any client that speaks plain Engine.IO (engine.io-client,
// python-engineio).
//
// # API
//
//	func NewServer(cfg Config, h Handler) *Server
//	func (*Server) ServeHTTP(w http.ResponseWriter, r *http.Request)
//	func (*Server) Lookup(sid string) *Conn
//	func (*Server) NumSessions() int
//	func (*Server) Shutdown(ctx context.Context) error
//
//	type Handler interface {
//		OnOpen(c *Conn, r *http.Request) error        // open: refuse with an error (HTTP 403)
//		OnMessage(c *Conn, data []byte, binary bool)  // read: one message, in order
//		OnClose(c *Conn, reason string)               // once per opened session
//	}
//
//	func NewMessage(data []byte, bins ...[]byte) *Message // text message + binary messages kept together
//	func NewBinaryMessage(b []byte) *Message
//	func (*Conn) Send(m *Message) error      // write: never blocks
//	func (*Conn) SendHint(m *Message) bool   // write what the peer can do without
//	func (*Conn) Queue(m *Message) error; func (*Conn) Flush()  // broadcast helpers
//	func (*Conn) Close(reason string)
//	func (*Conn) ID() string; RemoteAddr() string; Transport() string; SetData(any); Data() any
//
// # Connections and memory
//
// A websocket session costs one goroutine, its reader, started off the
// request's goroutine; the writer is a goroutine that exists only while
// there is something to write. Frames are written without a context per
// frame (Config.WriteTimeout is enforced by the heartbeat), messages are
// handed to OnMessage on a short-lived goroutine so that decoding them never
// grows the reader's stack, the hijacked connection keeps 512-byte buffers,
// and no session keeps its handshake request. A Message is immutable, so a
// broadcast builds it (and its websocket frame) once for every session.
// Send and Queue on a websocket session with nothing queued and no writer
// running write the frame at once from the caller's goroutine with one
// non-blocking system call; only what the socket does not take is queued for
// a writer goroutine, so a broadcast to idle sockets wakes no goroutine.
//
// # Flow control
//
// Each session has one bounded queue (Config.SendQueue messages). Send never
// blocks: a session whose queue is full is closed with reason "slow
// consumer", and nobody else waits. A ping that falls due jumps ahead of the
// queued messages. SendHint drops a message the peer can do without rather
// than queue it behind others.
//
// # Budgets
//
// Config.MaxSessions and Config.MaxSessionsPerAddr bound the open sessions
// (answers 503 and 429); Config.MaxPayload bounds a message or POST body
// (close code 1009, or 413). Every refusal is reported to Config.OnReject.
//
// # Protocol corners
//
// A websocket request for a session that has already upgraded (or is
// upgrading) is accepted and closed at once without a status, as the
// reference server does. Polling requests on an upgraded session get 400
// (code 3, "Bad request"). A GET pending when the upgrade completes is
// released with a noop; a GET while another is pending closes the session.
// A close packet POSTed while a GET is pending releases that GET with a noop.
//
// Session ids come from Config.SessionID (random by default); a cluster can
// embed a node identifier in them to route polling requests.
package engineio
