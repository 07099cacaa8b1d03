package sio

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/zndraw/joblib/internal/jsonguard"
	"github.com/zndraw/joblib/internal/sio/wire"
	"github.com/zndraw/joblib/server/sio/engineio"
)

// client is the Socket.IO side of one Engine.IO session: its sockets (one
// per connected namespace), the binary packet being assembled and the
// handler queue.
type client struct {
	srv  *Server
	conn *engineio.Conn
	hs   *handshake // what OnConnect may read of the handshake

	// partial is the binary packet waiting for attachments. Only OnMessage
	// touches it, and the engine serialises OnMessage calls.
	partial *partialPacket

	mu           sync.Mutex
	socks        []*Socket // connecting or connected, at most one per namespace
	gone         bool
	connectTimer *time.Timer

	// Dispatcher: handler calls run on a goroutine started on demand.
	dmu      sync.Mutex
	inbox    []inbound
	dRunning bool
}

// partialPacket is a binary packet whose attachments are arriving. Past a
// budget it keeps counting the attachments without keeping them.
type partialPacket struct {
	pkt       wire.SIOPacket
	sock      *Socket
	atts      [][]byte
	remaining int
	bytes     int64
	reject    string // the budget exceeded, if any
}

// limitError closes a session (or answers with RejectAck) for a budget.
type limitError struct{ limit, reason string }

func (e limitError) Error() string { return e.reason }

var errEventQueueFull = errors.New("event queue full")

func (c *client) closeFor(err error) {
	var le limitError
	switch {
	case errors.As(err, &le):
		c.close(le.reason)
	case errors.Is(err, errEventQueueFull):
		c.close(ReasonEventQueueFull)
	default:
		c.srv.cfg.Logger.Info("sio: protocol error", "remote", c.conn.RemoteAddr(), "err", err)
		c.close(ReasonParseError)
	}
}

func (c *client) close(reason string) { c.conn.CloseWith(closeCode(reason), reason) }

// closed runs when the Engine.IO session has closed: every socket goes.
func (c *client) closed(reason string) {
	c.mu.Lock()
	c.gone = true
	socks := c.socks
	c.socks = nil
	if c.connectTimer != nil {
		c.connectTimer.Stop()
	}
	c.mu.Unlock()
	for _, sock := range socks {
		c.saveSession(sock, reason)
		sock.gone()
		c.dispatch(inbound{kind: inDisconnect, sock: sock, reason: reason}, true)
	}
}

// connectTimedOut closes a session that is in no namespace. A CONNECT still
// being decided gets one more second.
func (c *client) connectTimedOut() {
	c.mu.Lock()
	connecting := false
	for _, s := range c.socks {
		if s.isConnected() {
			c.connectTimer = nil // armed again when the last namespace is left
			c.mu.Unlock()
			return
		}
		connecting = true
	}
	if connecting && !c.gone {
		c.connectTimer.Reset(time.Second)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.srv.cfg.OnReject(LimitConnect)
	c.close(reasonConnectTimeout)
}

// socket returns the socket of namespace ns (connecting or connected). Callers hold mu.
func (c *client) socketLocked(ns string) *Socket {
	for _, s := range c.socks {
		if s.ns.name == ns {
			return s
		}
	}
	return nil
}

// detachLocked removes sock; with no socket left the connect timeout runs
// again (after d; d == 0 leaves a running timeout alone, so that refused
// CONNECTs never extend it). Callers hold mu. It reports whether sock was
// attached.
func (c *client) detachLocked(sock *Socket, d time.Duration) bool {
	for i, s := range c.socks {
		if s == sock {
			c.socks = append(c.socks[:i], c.socks[i+1:]...)
			switch {
			case len(c.socks) > 0 || c.gone:
			case c.connectTimer == nil:
				c.connectTimer = time.AfterFunc(cmp.Or(d, c.srv.cfg.ConnectTimeout), c.connectTimedOut)
			case d > 0:
				c.connectTimer.Reset(d)
			}
			return true
		}
	}
	return false
}

func (c *client) onSIO(data []byte) error {
	if c.partial != nil {
		return fmt.Errorf("handle message: %w: text packet while waiting for attachments", wire.ErrInvalidPacket)
	}
	// Depth first, in one pass: nothing below may recurse into a deep payload.
	tooDeep := jsonguard.Depth(data, c.srv.cfg.MaxDepth) != nil
	pkt, err := wire.DecodeSIO(data)
	if err != nil {
		if tooDeep {
			c.srv.cfg.OnReject(LimitDepth)
			return limitError{limit: LimitDepth, reason: ReasonTooDeep}
		}
		return fmt.Errorf("handle message: %w", err)
	}
	nsp := c.srv.Namespace(pkt.Namespace)
	if nsp == nil {
		if pkt.Type == wire.SIOConnect {
			payload, _ := json.Marshal(map[string]string{"message": "Invalid namespace"})
			_ = c.conn.Send(sioMsg(wire.SIOPacket{Type: wire.SIOConnectError, Namespace: pkt.Namespace, Data: payload}, nil))
			return nil
		}
		return fmt.Errorf("handle message: %w: %v for namespace %q that is not joined", wire.ErrInvalidPacket, pkt.Type, pkt.Namespace)
	}

	switch pkt.Type {
	case wire.SIOConnect:
		c.mu.Lock()
		if c.gone {
			c.mu.Unlock()
			return nil
		}
		if c.socketLocked(nsp.name) != nil {
			c.mu.Unlock()
			return fmt.Errorf("handle message: %w: CONNECT for a namespace already joined", wire.ErrInvalidPacket)
		}
		sock := newSocket(c, nsp)
		c.socks = append(c.socks, sock)
		c.mu.Unlock()
		var auth json.RawMessage
		if len(pkt.Data) > 0 {
			auth = append(json.RawMessage(nil), pkt.Data...)
		}
		if !c.dispatch(inbound{kind: inConnect, sock: sock, auth: auth}, false) {
			return errEventQueueFull
		}
		return nil

	case wire.SIODisconnect:
		c.mu.Lock()
		sock := c.socketLocked(nsp.name)
		if sock == nil {
			c.mu.Unlock()
			return fmt.Errorf("handle message: %w: DISCONNECT without CONNECT", wire.ErrInvalidPacket)
		}
		c.detachLocked(sock, c.srv.cfg.ConnectTimeout)
		c.mu.Unlock()
		sock.gone()
		c.dispatch(inbound{kind: inDisconnect, sock: sock, reason: ReasonClientNamespaceDisconnect}, true)
		return nil

	case wire.SIOEvent, wire.SIOBinaryEvent, wire.SIOAck, wire.SIOBinaryAck:
		sock := c.connectedSocket(nsp.name)
		if sock == nil {
			return fmt.Errorf("handle message: %w: %v before CONNECT", wire.ErrInvalidPacket, pkt.Type)
		}
		cfg := &c.srv.cfg
		if pkt.Attachments > 0 {
			p := &partialPacket{pkt: pkt, sock: sock, remaining: pkt.Attachments, bytes: int64(len(data))}
			switch {
			case tooDeep:
				p.reject = LimitDepth
			case pkt.Attachments > cfg.MaxAttachments:
				p.reject = LimitAttachments
			case p.bytes > cfg.MaxEventBytes:
				p.reject = LimitEventBytes
			default:
				p.atts = make([][]byte, 0, min(pkt.Attachments, 16))
			}
			c.partial = p
			return nil
		}
		switch {
		case tooDeep:
			return c.reject(sock, pkt, LimitDepth)
		case int64(len(data)) > cfg.MaxEventBytes:
			return c.reject(sock, pkt, LimitEventBytes)
		}
		return c.complete(sock, pkt, nil)
	}
	return fmt.Errorf("handle message: %w: unexpected %v from client", wire.ErrInvalidPacket, pkt.Type)
}

// onAttachment takes one binary attachment, counting it against the
// packet's budgets as it arrives: past a budget it is dropped at once.
func (c *client) onAttachment(b []byte) error {
	p := c.partial
	if p == nil {
		return fmt.Errorf("handle attachment: %w: binary message without a binary packet", wire.ErrInvalidPacket)
	}
	p.remaining--
	if p.reject == "" {
		p.bytes += int64(len(b))
		if p.bytes > c.srv.cfg.MaxEventBytes {
			p.reject, p.atts = LimitEventBytes, nil
		} else {
			p.atts = append(p.atts, b)
		}
	}
	if p.remaining > 0 {
		return nil
	}
	c.partial = nil
	if p.reject != "" {
		return c.reject(p.sock, p.pkt, p.reject)
	}
	return c.complete(p.sock, p.pkt, p.atts)
}

// reject answers a packet past a budget: with Config.RejectAck when the
// client asked for an ack of an event, else by closing the session.
func (c *client) reject(sock *Socket, pkt wire.SIOPacket, limit string) error {
	c.srv.cfg.OnReject(limit)
	isEvent := pkt.Type == wire.SIOEvent || pkt.Type == wire.SIOBinaryEvent
	if isEvent && pkt.HasID && c.srv.cfg.RejectAck != nil {
		m, err := encodeAck(sock.ns.name, pkt.ID, c.srv.cfg.RejectAck(limit))
		if err == nil {
			_ = sock.send(m)
			return nil
		}
	}
	reason := map[string]string{LimitAttachments: ReasonTooManyAttachments, LimitEventBytes: ReasonEventTooLarge, LimitDepth: ReasonTooDeep}[limit]
	return limitError{limit: limit, reason: reason}
}

// complete delivers an event or ack whose attachments (if any) have all arrived.
func (c *client) complete(sock *Socket, pkt wire.SIOPacket, atts [][]byte) error {
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
	if !c.dispatch(it, false) {
		return errEventQueueFull
	}
	return nil
}

func (c *client) connectedSocket(ns string) *Socket {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.socketLocked(ns); s != nil && s.isConnected() {
		return s
	}
	return nil
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
func (c *client) dispatch(it inbound, force bool) bool {
	c.dmu.Lock()
	if !force && len(c.inbox) >= c.srv.cfg.SendQueue {
		c.dmu.Unlock()
		return false
	}
	c.inbox = append(c.inbox, it)
	start := !c.dRunning
	c.dRunning = true
	c.dmu.Unlock()
	if start {
		c.srv.tr.add()
		go c.runDispatch()
	}
	return true
}

func (c *client) runDispatch() {
	defer c.srv.tr.done()
	for {
		c.dmu.Lock()
		if len(c.inbox) == 0 {
			c.inbox = nil
			c.dRunning = false
			c.dmu.Unlock()
			return
		}
		it := c.inbox[0]
		c.inbox[0] = inbound{}
		c.inbox = c.inbox[1:]
		c.dmu.Unlock()
		c.handleInbound(it)
	}
}

func (c *client) handleInbound(it inbound) {
	defer func() {
		if v := recover(); v != nil {
			c.srv.cfg.Logger.Error("sio: handler panic", "socket", it.sock.id, "panic", v)
			c.close(ReasonTransportError)
		}
	}()
	h := it.sock.ns.handler()
	switch it.kind {
	case inConnect:
		c.runConnect(it.sock, it.auth)
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
			it.sock.ns.nsockets.Add(-1)
			h.OnDisconnect(it.sock, it.reason)
		}
	}
}

func (c *client) runConnect(sock *Socket, auth json.RawMessage) {
	if sock.isGone() {
		return
	}
	c.takeSession(sock, auth)
	err := sock.ns.handler().OnConnect(sock.ctx, sock, c.hs.request(), auth)
	if err != nil {
		sock.gone()
		c.mu.Lock()
		c.detachLocked(sock, 0)
		c.mu.Unlock()
		body := map[string]any{"message": err.Error()}
		var withData interface{ Data() any }
		if errors.As(err, &withData) {
			body["data"] = withData.Data()
		}
		payload, jerr := json.Marshal(body)
		if jerr != nil {
			payload, _ = json.Marshal(map[string]string{"message": err.Error()})
		}
		_ = c.conn.Send(sioMsg(wire.SIOPacket{Type: wire.SIOConnectError, Namespace: sock.ns.name, Data: payload}, nil))
		return
	}
	sock.ns.nsockets.Add(1)
	c.admitSession(sock)
	// accept marks the socket as accepted even when the session closed during
	// OnConnect, so that the queued disconnect still reaches OnDisconnect.
	sock.accept()
}

// sioMsg wraps a Socket.IO packet in an Engine.IO message.
func sioMsg(p wire.SIOPacket, bins [][]byte) *engineio.Message {
	text := make([]byte, 0, len(p.Data)+len(p.Namespace)+24)
	text = append(text, '0'+byte(wire.EIOMessage))
	text = wire.AppendSIO(text, p)
	return engineio.AppendMessage(text, bins...)
}

// encodeEvent builds an EVENT (or BINARY_EVENT when args hold []byte).
func encodeEvent(ns, event string, args []any, id uint64, hasID bool) (*engineio.Message, error) {
	m, _, err := encodeEventSize(ns, event, args, id, hasID)
	return m, err
}

// encodeEventSize is encodeEvent that also returns the packet's size in
// bytes, attachments included.
func encodeEventSize(ns, event string, args []any, id uint64, hasID bool) (*engineio.Message, int, error) {
	if wire.IsReservedEvent(event) {
		return nil, 0, fmt.Errorf("encode event %q: %w", event, ErrReservedEvent)
	}
	data, atts, err := eventData(event, args)
	if err != nil {
		return nil, 0, err
	}
	size := len(data)
	for _, a := range atts {
		size += len(a)
	}
	typ := wire.SIOEvent
	if len(atts) > 0 {
		typ = wire.SIOBinaryEvent
	}
	return sioMsg(wire.SIOPacket{Type: typ, Namespace: ns, ID: id, HasID: hasID, Attachments: len(atts), Data: data}, atts), size, nil
}

// eventData is an EVENT's JSON array [event, args...] and its binary
// attachments.
func eventData(event string, args []any) ([]byte, [][]byte, error) {
	if data, ok := appendArgsJSON(nil, event, args); ok {
		return data, nil, nil
	}
	var atts [][]byte
	arr := make([]any, 0, len(args)+1)
	arr = append(arr, event)
	for _, a := range args {
		arr = append(arr, wire.Deconstruct(a, &atts))
	}
	data, err := json.Marshal(arr)
	if err != nil {
		return nil, nil, fmt.Errorf("encode event %q: %w", event, err)
	}
	return data, atts, nil
}

// encodeAck builds an ACK (or BINARY_ACK) for ack id.
func encodeAck(ns string, id uint64, args []any) (*engineio.Message, error) {
	var atts [][]byte
	arr := make([]any, 0, len(args))
	for _, a := range args {
		arr = append(arr, wire.Deconstruct(a, &atts))
	}
	data, err := json.Marshal(arr)
	if err != nil {
		return nil, fmt.Errorf("encode ack %s: %w", strconv.FormatUint(id, 10), err)
	}
	typ := wire.SIOAck
	if len(atts) > 0 {
		typ = wire.SIOBinaryAck
	}
	return sioMsg(wire.SIOPacket{Type: typ, Namespace: ns, ID: id, HasID: true, Attachments: len(atts), Data: data}, atts), nil
}
