package engineio

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/zndraw/joblib/internal/sio/wire"
)

// Transport names, as Engine.IO spells them.
const (
	Polling   = "polling"
	WebSocket = "websocket"
)

// closeGrace is how long a close waits for the websocket writer to send its
// close frame before the connection is cut.
const closeGrace = time.Second

// Message is one outbound Engine.IO message: an optional text message
// followed by binary messages that are delivered contiguously after it (a
// Socket.IO packet and its attachments). A Message is never modified once
// built, so one Message may be sent to many sessions: a broadcast is encoded
// once.
type Message struct {
	text []byte   // "4<data>" (or a session packet such as "2"); nil for binary-only
	bins [][]byte // binary messages that follow text

	frames atomic.Pointer[[]byte] // the websocket frames, built on first use (see wsFrames)
	raw    []byte                 // websocket bytes still to write after a partial direct write
	open   bool                   // the open packet: nothing, not even a due ping, goes before it
}

// NewMessage builds a text message carrying data, followed by the binary
// messages bins. Neither data nor bins may be modified afterwards.
func NewMessage(data []byte, bins ...[]byte) *Message {
	text := make([]byte, 0, len(data)+1)
	text = append(text, '0'+byte(wire.EIOMessage))
	text = append(text, data...)
	return &Message{text: text, bins: bins}
}

// NewTextMessage is NewMessage for a string.
func NewTextMessage(data string) *Message { return NewMessage([]byte(data)) }

// NewBinaryMessage builds one binary message. b may not be modified afterwards.
func NewBinaryMessage(b []byte) *Message { return &Message{bins: [][]byte{b}} }

// AppendMessage builds a text message from an Engine.IO message payload that
// the caller has already prefixed with the message type '4' (see
// wire.AppendSIO); it saves one copy on hot paths.
func AppendMessage(text []byte, bins ...[]byte) *Message { return &Message{text: text, bins: bins} }

var (
	msgPing  = &Message{text: []byte{'0' + byte(wire.EIOPing)}}
	msgNoop  = []byte{'0' + byte(wire.EIONoop)}
	msgClose = []byte{'0' + byte(wire.EIOClose)}
)

// Errors returned by Conn methods.
var (
	// ErrClosed: the session is closed.
	ErrClosed = errors.New("engineio: session closed")
	// ErrSlowConsumer: the send queue was full; the session is being closed
	// with reason "slow consumer".
	ErrSlowConsumer = errors.New("engineio: send queue full")
)

// sendQueue is a session's bounded outbound queue. Pushes never block. While
// the session polls, a pending GET takes everything at once; once it runs on
// a websocket, a writer goroutine is started when the queue becomes
// non-empty and exits when it has drained it, so an idle session has none.
type sendQueue struct {
	mu      sync.Mutex
	items   []*Message
	hints   int // hints among items
	max     int
	closed  bool
	ws      *websocket.Conn // set once the session writes to a websocket
	wc      *wsConn         // ws's connection, where data frames are written
	writing bool            // a writer goroutine owns ws
	// ping is a pending ping: it jumps the queue so that a heartbeat never
	// waits behind queued data.
	ping atomic.Bool
}

// push appends m; start reports that the caller must start a writer.
//
// On a websocket with nothing queued, no writer running and no ping due, m
// is written at once from the caller's goroutine, as far as the socket
// buffer takes it without blocking; only what is left is queued (a partial
// frame first, so the stream stays whole and in order) and a writer started
// for it. A write error is returned as errWriteFailed: the caller closes the
// session.
func (q *sendQueue) push(m *Message, wake bool) (start bool, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return false, ErrClosed
	}
	if len(q.items) >= q.max {
		return false, ErrSlowConsumer
	}
	if q.wc != nil && len(q.items) == 0 && !q.writing && !q.ping.Load() {
		f := m.wsFrames()
		n, err := q.wc.tryWrite(f)
		switch {
		case err == nil && n == len(f):
			return false, nil
		case err == nil || errors.Is(err, errWouldBlock):
			if n > 0 {
				m = &Message{raw: f[n:]}
			}
			q.items = append(q.items, m)
			// A partial frame must be finished by a writer now, whatever
			// the caller asked: nothing else may be written before it.
			return (wake || n > 0) && q.claimWriterLocked(), nil
		default:
			return false, errWriteFailed
		}
	}
	q.items = append(q.items, m)
	return wake && q.claimWriterLocked(), nil
}

// errWriteFailed: a direct write failed; the connection is broken.
var errWriteFailed = errors.New("engineio: write failed")

func (q *sendQueue) claimWriterLocked() bool {
	if q.ws == nil || q.writing {
		return false
	}
	q.writing = true
	return true
}

// Conn is one Engine.IO session, whatever its transport. Its methods are
// safe for concurrent use.
type Conn struct {
	srv  *Server
	id   string
	addr string // remote IP: the per-address budget's key

	q    sendQueue
	wake chan struct{} // polling: "the queue may have something" (capacity 1)

	// inMu serialises inbound packets: during an upgrade both transports may
	// deliver packets.
	inMu sync.Mutex

	// writeSince is when the current websocket write started (UnixNano), 0
	// when none is in progress.
	writeSince atomic.Int64
	dropOutput atomic.Bool

	mu           sync.Mutex
	data         any
	closed       bool
	reason       string
	code         websocket.StatusCode // explicit close code (CloseWith)
	clientClosed bool                 // the client sent a close packet
	transport    string
	upgrading    bool
	probed       bool
	getActive    bool
	postActive   bool
	waitingPong  bool
	hb           *time.Timer     // heartbeat: next ping, or the pong deadline
	ws           *websocket.Conn // the websocket once upgraded (or from the start)
	probe        *websocket.Conn // the websocket being probed during an upgrade
	grace        *time.Timer
}

// ID returns the session id (a bearer secret for polling requests; do not log it).
func (c *Conn) ID() string { return c.id }

// RemoteAddr returns the IP address of the client that opened the session.
func (c *Conn) RemoteAddr() string { return c.addr }

// Transport returns Polling or WebSocket.
func (c *Conn) Transport() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.transport
}

// SetData stores the embedding layer's per-session state.
func (c *Conn) SetData(v any) {
	c.mu.Lock()
	c.data = v
	c.mu.Unlock()
}

// Data returns what SetData stored.
func (c *Conn) Data() any {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.data
}

// Closed reports whether the session is closed.
func (c *Conn) Closed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// PollWaiting reports whether a long-poll GET is waiting on the session
// (diagnostics).
func (c *Conn) PollWaiting() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.getActive
}

// closedByPeerError reports whether the session was closed for something
// the client sent (not by the client, the heartbeat or a shutdown).
func (c *Conn) closedByPeerError() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed || c.clientClosed {
		return false
	}
	switch c.reason {
	case ReasonServerShutdown, ReasonPingTimeout, ReasonSlowConsumer, ReasonTransportError, ReasonTransportClose:
		return false
	}
	return true
}

// Send queues m without blocking. It returns ErrClosed once the session is
// closed and ErrSlowConsumer when the queue is full (the session is then
// closed with reason "slow consumer").
func (c *Conn) Send(m *Message) error {
	start, err := c.q.push(m, true)
	return c.afterPush(start, true, err)
}

// Queue is Send without waking the writer: a broadcast queues to every
// member first and calls Flush on each afterwards, so that it does not
// compete for locks with writers it has just woken.
func (c *Conn) Queue(m *Message) error {
	start, err := c.q.push(m, false)
	return c.afterPush(start, false, err)
}

// Flush wakes the writer for messages added by Queue.
func (c *Conn) Flush() {
	c.q.mu.Lock()
	err := c.q.pingDirectLocked()
	start := err == nil && (len(c.q.items) > 0 || c.q.ping.Load()) && c.q.claimWriterLocked()
	c.q.mu.Unlock()
	c.afterPush(start, true, err)
}

// pingDirectLocked writes a due ping at once, as push does a message, when
// the websocket has nothing queued and no writer: a heartbeat of an idle
// session then starts no goroutine. Whatever the socket does not take is
// left to a writer.
func (q *sendQueue) pingDirectLocked() error {
	if q.wc == nil || q.closed || q.writing || len(q.items) > 0 || !q.ping.Load() {
		return nil
	}
	f := msgPing.wsFrames()
	n, err := q.wc.tryWrite(f)
	switch {
	case err == nil && n == len(f):
		q.ping.Store(false)
	case err == nil || errors.Is(err, errWouldBlock):
		if n > 0 {
			q.ping.Store(false)
			q.items = append(q.items, &Message{raw: f[n:]})
		}
	default:
		return errWriteFailed
	}
	return nil
}

// SendAll queues ms atomically: all of them or none. Unlike Send it does not
// close the session when the queue is full: it returns ErrSlowConsumer and
// leaves the decision to the caller.
func (c *Conn) SendAll(ms []*Message) error {
	c.q.mu.Lock()
	var err error
	start := false
	switch {
	case c.q.closed:
		err = ErrClosed
	case len(c.q.items)+len(ms) > c.q.max:
		err = ErrSlowConsumer
	default:
		c.q.items = append(c.q.items, ms...)
		start = c.q.claimWriterLocked()
	}
	c.q.mu.Unlock()
	if err != nil {
		return err
	}
	return c.afterPush(start, true, nil)
}

// SendHint queues m as a hint: a message the peer can do without (it will
// learn the same later by other means). A hint is dropped, and SendHint
// reports false, when the same bytes are already waiting in the queue, when
// Config.MaxHints hints are waiting, or when the queue is half full; a hint
// never closes the session as a slow consumer.
func (c *Conn) SendHint(m *Message) bool {
	c.q.mu.Lock()
	ok := !c.q.closed && c.q.hints < c.srv.cfg.MaxHints && len(c.q.items) < c.q.max/2
	if ok {
		for _, it := range c.q.items {
			if it == m || (len(it.bins) == 0 && len(m.bins) == 0 && bytes.Equal(it.text, m.text)) {
				ok = false
				break
			}
		}
	}
	start := false
	if ok {
		c.q.items = append(c.q.items, m)
		c.q.hints++
		start = c.q.claimWriterLocked()
	}
	c.q.mu.Unlock()
	if ok {
		c.afterPush(start, true, nil)
	}
	return ok
}

func (c *Conn) afterPush(start, wake bool, err error) error {
	if errors.Is(err, errWriteFailed) {
		c.close(ReasonTransportError)
		c.abort()
		return ErrClosed
	}
	if errors.Is(err, ErrSlowConsumer) {
		c.Close(ReasonSlowConsumer)
		return err
	}
	if start {
		c.startWriter()
	} else if wake && err == nil {
		c.signal()
	}
	return err
}

func (c *Conn) signal() {
	if c.wake == nil {
		return
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// take returns every queued message (into spare) and whether a ping is due.
func (c *Conn) take(spare []*Message) ([]*Message, bool) {
	ping := c.q.ping.Swap(false)
	clear(spare)
	c.q.mu.Lock()
	items := c.q.items
	c.q.items = spare[:0]
	c.q.hints = 0
	c.q.mu.Unlock()
	return items, ping
}

// Close closes the session with reason: queued messages are dropped, a
// websocket client gets a close frame (code per reason; see CloseCode), a
// pending long-poll gets a close packet. Handler.OnClose is called once.
// Close never blocks on the network.
func (c *Conn) Close(reason string) { c.closeWith(0, reason) }

// CloseWith is Close with an explicit websocket close code.
func (c *Conn) CloseWith(code websocket.StatusCode, reason string) { c.closeWith(code, reason) }

func (c *Conn) close(reason string) { c.closeWith(0, reason) }

func (c *Conn) closeWith(code websocket.StatusCode, reason string) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.reason = reason
	c.code = code
	if c.hb != nil {
		c.hb.Stop()
	}
	ws, probe := c.ws, c.probe
	if ws != nil {
		// The writer sends the close frame; if it is stuck in a write to a
		// peer that does not read, cut the connection after a grace period.
		c.grace = time.AfterFunc(closeGrace, func() { _ = ws.CloseNow() })
	}
	c.mu.Unlock()

	c.dropOutput.Store(true)
	c.q.mu.Lock()
	c.q.closed = true
	c.q.items = nil
	c.q.hints = 0
	start := c.q.claimWriterLocked()
	c.q.mu.Unlock()
	// Unregister before waking a pending GET: once a polling client has the
	// close packet, its next request must find the session gone (400), not
	// still registered for a moment.
	c.srv.remove(c)
	if start {
		c.startWriter()
	}
	c.signal()
	if probe != nil {
		_ = probe.CloseNow()
	}
	c.srv.h.OnClose(c, reason)
	switch reason {
	case ReasonServerShutdown, ReasonTransportClose:
		c.srv.cfg.Logger.Debug("engineio: session closed", "remote", c.addr, "reason", reason)
	default:
		c.srv.cfg.Logger.Info("engineio: session closed", "remote", c.addr, "reason", reason)
	}
}

// abort cuts the websocket(s) at once.
func (c *Conn) abort() {
	c.mu.Lock()
	ws, probe := c.ws, c.probe
	c.mu.Unlock()
	if ws != nil {
		_ = ws.CloseNow()
	}
	if probe != nil {
		_ = probe.CloseNow()
	}
}

func (c *Conn) closeStatus() (websocket.StatusCode, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.code != 0 {
		return c.code, closeText(c.reason)
	}
	return CloseCode(c.reason), closeText(c.reason)
}

func (c *Conn) openPacket() *Message {
	upgrades := []string{}
	if c.transport == Polling {
		upgrades = []string{WebSocket}
	}
	cfg := &c.srv.cfg
	data, _ := json.Marshal(struct {
		SID          string   `json:"sid"`
		Upgrades     []string `json:"upgrades"`
		PingInterval int64    `json:"pingInterval"`
		PingTimeout  int64    `json:"pingTimeout"`
		MaxPayload   int64    `json:"maxPayload"`
	}{c.id, upgrades, cfg.PingInterval.Milliseconds(), cfg.PingTimeout.Milliseconds(), cfg.MaxPayload})
	return &Message{text: append([]byte{'0' + byte(wire.EIOOpen)}, data...), open: true}
}

// startHeartbeat arms the first ping.
func (c *Conn) startHeartbeat() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.hb = time.AfterFunc(c.srv.cfg.PingInterval, c.heartbeat)
	}
}

// heartbeat runs on the heartbeat timer: it sends a ping, or closes the
// session when the previous one went unanswered or a write is stuck.
func (c *Conn) heartbeat() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	if c.waitingPong {
		c.mu.Unlock()
		c.close(ReasonPingTimeout)
		return
	}
	if since := c.writeSince.Load(); since != 0 && time.Since(time.Unix(0, since)) > c.srv.cfg.WriteTimeout {
		c.mu.Unlock()
		c.close(ReasonTransportError)
		c.abort()
		return
	}
	c.waitingPong = true
	c.hb.Reset(c.srv.cfg.PingTimeout)
	c.mu.Unlock()
	c.q.ping.Store(true)
	c.Flush()
}

func (c *Conn) gotPong() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || !c.waitingPong {
		return
	}
	c.waitingPong = false
	c.hb.Reset(c.srv.cfg.PingInterval)
}

// errPeerClose reports a close packet from the client.
var errPeerClose = errors.New("client closed the session")

// handlePacket processes one inbound Engine.IO packet. Callers hold inMu.
func (c *Conn) handlePacket(p wire.EIOPacket) error {
	switch p.Type {
	case wire.EIOPong:
		c.gotPong()
		return nil
	case wire.EIOMessage:
		if c.Closed() {
			return nil
		}
		c.srv.h.OnMessage(c, p.Data, p.Binary)
		return nil
	case wire.EIOClose:
		return errPeerClose
	case wire.EIOPing:
		return fmt.Errorf("handle packet: %w: ping from client (invalid heartbeat direction)", wire.ErrInvalidPacket)
	case wire.EIOUpgrade, wire.EIONoop:
		return nil
	}
	return fmt.Errorf("handle packet: %w: unexpected %v packet", wire.ErrInvalidPacket, p.Type)
}

// closeFor closes the session after an inbound error.
func (c *Conn) closeFor(err error) {
	if errors.Is(err, errPeerClose) {
		c.mu.Lock()
		c.clientClosed = true
		c.mu.Unlock()
		c.close(ReasonTransportClose)
		return
	}
	c.srv.cfg.Logger.Info("engineio: protocol error", "remote", c.addr, "err", err)
	c.close(ReasonParseError)
}
