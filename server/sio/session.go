package sio

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/zndraw/joblib/server/sio/wire"
)

const (
	transportPolling   = "polling"
	transportWebSocket = "websocket"

	// closeGrace is how long an immediate close waits for the websocket writer to
	// send its close frame before the connection is cut.
	closeGrace = time.Second
)

// outMsg is one outbound Engine.IO text packet plus the binary attachments that
// must follow it contiguously. Broadcasts share one outMsg between all sockets,
// so it is never modified after creation.
type outMsg struct {
	text []byte   // "<eio type><data>", e.g. `42["x",1]` or "2"
	bins [][]byte // binary messages that follow text
}

var (
	msgPing  = outMsg{text: []byte{'0' + byte(wire.EIOPing)}}
	msgNoop  = []byte{'0' + byte(wire.EIONoop)}
	msgClose = []byte{'0' + byte(wire.EIOClose)}
)

// sendQueue is a connection's bounded outbound queue. Pushes never block; the
// single consumer (the websocket writer, or the pending long-poll GET) takes
// everything at once.
type sendQueue struct {
	mu     sync.Mutex
	items  []outMsg
	max    int
	closed bool
	wake   chan struct{} // capacity 1: "items may be available"
}

func (q *sendQueue) push(m outMsg) error {
	if err := q.pushQuiet(m); err != nil {
		return err
	}
	q.signal()
	return nil
}

// pushQuiet enqueues without waking the consumer; the caller signals later. A
// broadcast pushes to every member first and wakes them afterwards, so that it
// does not compete for queue locks with writers it has just woken (a parked
// broadcaster would wait behind every runnable writer).
func (q *sendQueue) pushQuiet(m outMsg) error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return ErrClosed
	}
	if len(q.items) >= q.max {
		q.mu.Unlock()
		return errQueueFull
	}
	q.items = append(q.items, m)
	q.mu.Unlock()
	return nil
}

// pushAll pushes ms atomically: all or nothing.
func (q *sendQueue) pushAll(ms []outMsg) error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return ErrClosed
	}
	if len(q.items)+len(ms) > q.max {
		q.mu.Unlock()
		return errQueueFull
	}
	q.items = append(q.items, ms...)
	q.mu.Unlock()
	q.signal()
	return nil
}

func (q *sendQueue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// take returns every queued item; spare (emptied) becomes the new backing array.
func (q *sendQueue) take(spare []outMsg) []outMsg {
	clear(spare)
	q.mu.Lock()
	items := q.items
	q.items = spare[:0]
	q.mu.Unlock()
	return items
}

// close refuses further pushes; without flush the queued items are dropped.
func (q *sendQueue) close(flush bool) {
	q.mu.Lock()
	q.closed = true
	if !flush {
		q.items = nil
	}
	q.mu.Unlock()
	q.signal()
}

func (q *sendQueue) isClosed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closed
}

// nsState is the state of namespace "/" on a session.
type nsState int

const (
	nsNone nsState = iota
	nsConnecting
	nsConnected
)

// session is one Engine.IO session: transport(s), heartbeat, outbound queue, and
// the Socket.IO state of namespace "/".
type session struct {
	srv *Server
	sid string // Engine.IO session id: a bearer secret, never logged or exposed
	req *http.Request
	log *slog.Logger

	ctx    context.Context // cancelled when the session closes
	cancel context.CancelFunc
	// ioCtx carries websocket reads and writes; cancelling it cuts the
	// connection at once (coder/websocket closes on context cancellation), so it
	// is only cancelled when the connection must die now.
	ioCtx context.Context
	abort context.CancelFunc

	q sendQueue
	// dropOutput is set by an immediate close: the writer stops even in the
	// middle of a batch it has already taken.
	dropOutput atomic.Bool

	// inMu serialises inbound packet handling: during an upgrade both transports
	// may deliver packets.
	inMu    sync.Mutex
	partial *partialPacket // binary packet waiting for attachments (guarded by inMu)

	mu           sync.Mutex
	closed       bool
	reason       string
	clientClosed bool // the client sent an Engine.IO close: a pending GET gets noop, not close
	lingering    bool // closed with queued packets that a final GET should collect
	transport    string
	upgrading    bool
	probed       bool
	getActive    bool
	postActive   bool
	sock         *Socket
	ns           nsState
	waitingPong  bool
	pingTimer    *time.Timer
	pongTimer    *time.Timer
	connectTimer *time.Timer
	lingerTimer  *time.Timer

	// Dispatcher: handler calls run on a goroutine started on demand.
	dmu      sync.Mutex
	inbox    []inbound
	dRunning bool
}

type partialPacket struct {
	pkt  wire.SIOPacket
	sock *Socket
	atts [][]byte
}

func newSession(srv *Server, r *http.Request, transport string) *session {
	s := &session{
		srv:       srv,
		sid:       randomID(),
		req:       r.Clone(context.WithoutCancel(r.Context())),
		log:       srv.cfg.Logger.With("remote", r.RemoteAddr),
		transport: transport,
		q:         sendQueue{max: srv.cfg.SendQueue, wake: make(chan struct{}, 1)},
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.ioCtx, s.abort = context.WithCancel(context.Background())
	return s
}

func (s *session) openPacket() outMsg {
	upgrades := []string{}
	if s.transport == transportPolling {
		upgrades = []string{transportWebSocket}
	}
	data, _ := json.Marshal(struct {
		SID          string   `json:"sid"`
		Upgrades     []string `json:"upgrades"`
		PingInterval int64    `json:"pingInterval"`
		PingTimeout  int64    `json:"pingTimeout"`
		MaxPayload   int64    `json:"maxPayload"`
	}{s.sid, upgrades, s.srv.cfg.PingInterval.Milliseconds(), s.srv.cfg.PingTimeout.Milliseconds(), s.srv.cfg.MaxPayload})
	return outMsg{text: append([]byte{'0' + byte(wire.EIOOpen)}, data...)}
}

// startTimers arms the heartbeat and the connect timeout.
func (s *session) startTimers() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.pingTimer = time.AfterFunc(s.srv.cfg.PingInterval, s.sendPing)
	s.connectTimer = time.AfterFunc(s.srv.cfg.ConnectTimeout, s.connectTimedOut)
}

func (s *session) sendPing() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.waitingPong = true
	if s.pongTimer == nil {
		s.pongTimer = time.AfterFunc(s.srv.cfg.PingTimeout, s.pongTimedOut)
	} else {
		s.pongTimer.Reset(s.srv.cfg.PingTimeout)
	}
	s.mu.Unlock()
	s.pushOrClose(msgPing)
}

func (s *session) pongTimedOut() {
	s.mu.Lock()
	expired := s.waitingPong && !s.closed
	s.mu.Unlock()
	if expired {
		s.close(ReasonPingTimeout, false)
	}
}

func (s *session) gotPong() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || !s.waitingPong {
		return
	}
	s.waitingPong = false
	s.pongTimer.Stop()
	s.pingTimer.Reset(s.srv.cfg.PingInterval)
}

func (s *session) connectTimedOut() {
	s.mu.Lock()
	expired := s.ns == nsNone && !s.closed
	s.mu.Unlock()
	if expired {
		s.close(reasonConnectTimeout, false)
	}
}

// pushOrClose enqueues a session-level packet; a full queue closes the session.
func (s *session) pushOrClose(m outMsg) {
	if err := s.q.push(m); errors.Is(err, errQueueFull) {
		s.close(ReasonSlowConsumer, false)
	}
}

// close ends the session once. With flush, packets already queued are still
// delivered (a websocket writer drains them before its close frame; a polling
// session lingers until a GET collects them); without, they are dropped.
// close never blocks on the network.
func (s *session) close(reason string, flush bool) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.reason = reason
	for _, t := range []*time.Timer{s.pingTimer, s.pongTimer, s.connectTimer} {
		if t != nil {
			t.Stop()
		}
	}
	sock := s.sock
	s.sock = nil
	s.ns = nsNone
	transport := s.transport
	linger := transport == transportPolling && flush && !s.clientClosed
	s.lingering = linger
	if linger {
		s.lingerTimer = time.AfterFunc(s.srv.cfg.PingInterval, func() { s.srv.removeSession(s) })
	}
	s.mu.Unlock()

	s.dropOutput.Store(!flush)
	s.q.close(flush)
	s.cancel()
	if sock != nil {
		sock.gone()
		s.dispatch(inbound{kind: inDisconnect, sock: sock, reason: reason}, true)
	}
	if !linger {
		s.srv.removeSession(s)
	}
	if transport == transportWebSocket && !flush {
		// The writer sends the close frame; if it is stuck in a write to a peer
		// that does not read, cut the connection after a grace period.
		t := time.AfterFunc(closeGrace, s.abort)
		context.AfterFunc(s.ioCtx, func() { t.Stop() })
	}
	if reason == ReasonServerShutdown || reason == ReasonTransportClose || reason == ReasonServerNamespaceDisconnect || reason == ReasonClientNamespaceDisconnect {
		s.log.Debug("sio: session closed", "reason", reason)
	} else {
		s.log.Info("sio: session closed", "reason", reason)
	}
}

func (s *session) closeStatus() (websocket.StatusCode, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return closeCode(s.reason), closeText(s.reason)
}

// Inbound errors, mapped to close reasons by closeFor.
var (
	errPeerClose      = errors.New("client closed the session")
	errEventQueueFull = errors.New("event queue full")
)

func (s *session) closeFor(err error) {
	switch {
	case errors.Is(err, errPeerClose):
		s.mu.Lock()
		s.clientClosed = true
		s.mu.Unlock()
		s.close(ReasonTransportClose, false)
	case errors.Is(err, errEventQueueFull):
		s.close(ReasonEventQueueFull, false)
	default:
		s.log.Info("sio: protocol error", "err", err)
		s.close(ReasonParseError, false)
	}
}

// handlePacket processes one inbound Engine.IO packet. Callers hold inMu.
func (s *session) handlePacket(p wire.EIOPacket) error {
	switch p.Type {
	case wire.EIOPong:
		s.gotPong()
		return nil
	case wire.EIOMessage:
		if p.Binary {
			return s.onAttachment(p.Data)
		}
		return s.onSIO(p.Data)
	case wire.EIOClose:
		return errPeerClose
	case wire.EIOPing:
		return fmt.Errorf("handle packet: %w: ping from client (invalid heartbeat direction)", wire.ErrInvalidPacket)
	case wire.EIOUpgrade, wire.EIONoop:
		return nil
	}
	return fmt.Errorf("handle packet: %w: unexpected %v packet", wire.ErrInvalidPacket, p.Type)
}

func (s *session) onSIO(data []byte) error {
	if s.partial != nil {
		return fmt.Errorf("handle message: %w: text packet while waiting for attachments", wire.ErrInvalidPacket)
	}
	pkt, err := wire.DecodeSIO(data)
	if err != nil {
		return fmt.Errorf("handle message: %w", err)
	}
	if pkt.Namespace != "/" {
		if pkt.Type == wire.SIOConnect {
			payload, _ := json.Marshal(map[string]string{"message": "Invalid namespace"})
			s.pushOrClose(sioMsg(wire.SIOPacket{Type: wire.SIOConnectError, Namespace: pkt.Namespace, Data: payload}, nil))
			return nil
		}
		return fmt.Errorf("handle message: %w: %v for namespace %q that is not joined", wire.ErrInvalidPacket, pkt.Type, pkt.Namespace)
	}

	switch pkt.Type {
	case wire.SIOConnect:
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil
		}
		if s.ns != nsNone {
			s.mu.Unlock()
			return fmt.Errorf("handle message: %w: CONNECT for a namespace already joined", wire.ErrInvalidPacket)
		}
		sock := newSocket(s)
		s.sock, s.ns = sock, nsConnecting
		s.mu.Unlock()
		var auth json.RawMessage
		if len(pkt.Data) > 0 {
			auth = append(json.RawMessage(nil), pkt.Data...)
		}
		if !s.dispatch(inbound{kind: inConnect, sock: sock, auth: auth}, false) {
			return errEventQueueFull
		}
		return nil

	case wire.SIODisconnect:
		s.mu.Lock()
		sock := s.sock
		if s.ns == nsNone || sock == nil {
			s.mu.Unlock()
			return fmt.Errorf("handle message: %w: DISCONNECT without CONNECT", wire.ErrInvalidPacket)
		}
		s.sock, s.ns = nil, nsNone
		if s.connectTimer != nil {
			s.connectTimer.Reset(s.srv.cfg.ConnectTimeout)
		}
		s.mu.Unlock()
		sock.gone()
		s.dispatch(inbound{kind: inDisconnect, sock: sock, reason: ReasonClientNamespaceDisconnect}, true)
		return nil

	case wire.SIOEvent, wire.SIOBinaryEvent, wire.SIOAck, wire.SIOBinaryAck:
		sock := s.connectedSocket()
		if sock == nil {
			return fmt.Errorf("handle message: %w: %v before CONNECT", wire.ErrInvalidPacket, pkt.Type)
		}
		if pkt.Attachments > 0 {
			s.partial = &partialPacket{pkt: pkt, sock: sock, atts: make([][]byte, 0, min(pkt.Attachments, 16))}
			return nil
		}
		return s.complete(sock, pkt, nil)
	}
	return fmt.Errorf("handle message: %w: unexpected %v from client", wire.ErrInvalidPacket, pkt.Type)
}

func (s *session) onAttachment(b []byte) error {
	p := s.partial
	if p == nil {
		return fmt.Errorf("handle attachment: %w: binary message without a binary packet", wire.ErrInvalidPacket)
	}
	p.atts = append(p.atts, b)
	if len(p.atts) < p.pkt.Attachments {
		return nil
	}
	s.partial = nil
	return s.complete(p.sock, p.pkt, p.atts)
}

// complete delivers an event or ack whose attachments (if any) have all arrived.
func (s *session) complete(sock *Socket, pkt wire.SIOPacket, atts [][]byte) error {
	if atts != nil {
		if err := wire.CheckPlaceholders(pkt.Data, len(atts)); err != nil {
			return fmt.Errorf("handle message: %w", err)
		}
	}
	switch pkt.Type {
	case wire.SIOAck, wire.SIOBinaryAck:
		var args []json.RawMessage
		if err := json.Unmarshal(pkt.Data, &args); err != nil {
			return fmt.Errorf("handle ack: %w: %v", wire.ErrInvalidPacket, err)
		}
		if atts != nil {
			for i, a := range args {
				inl, err := wire.InlineAttachments(a, atts)
				if err != nil {
					return fmt.Errorf("handle ack: %w", err)
				}
				args[i] = inl
			}
		}
		if !pkt.HasID {
			return fmt.Errorf("handle ack: %w: ack without id", wire.ErrInvalidPacket)
		}
		sock.resolveAck(pkt.ID, args)
		return nil
	}
	name, args, err := wire.SplitEvent(pkt.Data)
	if err != nil {
		return fmt.Errorf("handle event: %w", err)
	}
	it := inbound{kind: inEvent, sock: sock, ev: Event{Name: name, Args: args, Attachments: atts}, ackID: pkt.ID, hasAck: pkt.HasID}
	if !s.dispatch(it, false) {
		return errEventQueueFull
	}
	return nil
}

func (s *session) connectedSocket() *Socket {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ns != nsConnected {
		return nil
	}
	return s.sock
}

// inbound is one unit of work for the handler.
type inbound struct {
	kind   int
	sock   *Socket
	auth   json.RawMessage
	ev     Event
	ackID  uint64
	hasAck bool
	reason string
}

const (
	inConnect = iota
	inEvent
	inDisconnect
)

// dispatch queues handler work; force bypasses the bound (used for disconnects,
// which must never be lost). It reports false when the inbox is full.
func (s *session) dispatch(it inbound, force bool) bool {
	s.dmu.Lock()
	if !force && len(s.inbox) >= s.srv.cfg.SendQueue {
		s.dmu.Unlock()
		return false
	}
	s.inbox = append(s.inbox, it)
	start := !s.dRunning
	s.dRunning = true
	s.dmu.Unlock()
	if start {
		s.srv.tr.add()
		go s.runDispatch()
	}
	return true
}

func (s *session) runDispatch() {
	defer s.srv.tr.done()
	for {
		s.dmu.Lock()
		if len(s.inbox) == 0 {
			s.inbox = nil
			s.dRunning = false
			s.dmu.Unlock()
			return
		}
		it := s.inbox[0]
		s.inbox[0] = inbound{}
		s.inbox = s.inbox[1:]
		s.dmu.Unlock()
		s.handleInbound(it)
	}
}

func (s *session) handleInbound(it inbound) {
	defer func() {
		if v := recover(); v != nil {
			s.log.Error("sio: handler panic", "socket", it.sock.id, "panic", v)
			s.close(ReasonTransportError, false)
		}
	}()
	h := s.srv.h
	switch it.kind {
	case inConnect:
		s.runConnect(it.sock, it.auth)
	case inEvent:
		if it.sock.isGone() {
			return
		}
		var ack AckFunc
		if it.hasAck {
			ack = it.sock.ackFunc(it.ackID)
		}
		h.OnEvent(it.sock.ctx, it.sock, it.ev, ack)
	case inDisconnect:
		if it.sock.finish() {
			s.srv.nsockets.Add(-1)
			h.OnDisconnect(it.sock, it.reason)
		}
	}
}

func (s *session) runConnect(sock *Socket, auth json.RawMessage) {
	if sock.isGone() {
		return
	}
	err := s.srv.h.OnConnect(sock.ctx, sock, s.req, auth)
	if err != nil {
		sock.gone()
		s.mu.Lock()
		if s.sock == sock {
			s.sock, s.ns = nil, nsNone
		}
		s.mu.Unlock()
		body := map[string]any{"message": err.Error()}
		var withData interface{ Data() any }
		if errors.As(err, &withData) {
			body["data"] = withData.Data()
		}
		payload, jerr := json.Marshal(body)
		if jerr != nil {
			payload, _ = json.Marshal(map[string]string{"message": err.Error()})
		}
		s.pushOrClose(sioMsg(wire.SIOPacket{Type: wire.SIOConnectError, Data: payload}, nil))
		return
	}
	s.srv.nsockets.Add(1)
	s.mu.Lock()
	if s.sock == sock && !s.closed {
		s.ns = nsConnected
		if s.connectTimer != nil {
			s.connectTimer.Stop()
		}
	}
	s.mu.Unlock()
	// accept marks the socket as accepted even when the session closed during
	// OnConnect, so that the queued disconnect still reaches OnDisconnect.
	sock.accept()
}

// sioMsg wraps a Socket.IO packet in an Engine.IO message.
func sioMsg(p wire.SIOPacket, bins [][]byte) outMsg {
	text := make([]byte, 0, len(p.Data)+24)
	text = append(text, '0'+byte(wire.EIOMessage))
	text = wire.AppendSIO(text, p)
	return outMsg{text: text, bins: bins}
}

// encodeEvent builds an EVENT (or BINARY_EVENT when args hold []byte).
func encodeEvent(event string, args []any, id uint64, hasID bool) (outMsg, error) {
	if wire.IsReservedEvent(event) {
		return outMsg{}, fmt.Errorf("encode event %q: %w", event, ErrReservedEvent)
	}
	var atts [][]byte
	arr := make([]any, 0, len(args)+1)
	arr = append(arr, event)
	for _, a := range args {
		arr = append(arr, wire.Deconstruct(a, &atts))
	}
	data, err := json.Marshal(arr)
	if err != nil {
		return outMsg{}, fmt.Errorf("encode event %q: %w", event, err)
	}
	typ := wire.SIOEvent
	if len(atts) > 0 {
		typ = wire.SIOBinaryEvent
	}
	return sioMsg(wire.SIOPacket{Type: typ, ID: id, HasID: hasID, Attachments: len(atts), Data: data}, atts), nil
}

// encodeAck builds an ACK (or BINARY_ACK) for ack id.
func encodeAck(id uint64, args []any) (outMsg, error) {
	var atts [][]byte
	arr := make([]any, 0, len(args))
	for _, a := range args {
		arr = append(arr, wire.Deconstruct(a, &atts))
	}
	data, err := json.Marshal(arr)
	if err != nil {
		return outMsg{}, fmt.Errorf("encode ack %s: %w", strconv.FormatUint(id, 10), err)
	}
	typ := wire.SIOAck
	if len(atts) > 0 {
		typ = wire.SIOBinaryAck
	}
	return sioMsg(wire.SIOPacket{Type: typ, ID: id, HasID: true, Attachments: len(atts), Data: data}, atts), nil
}
