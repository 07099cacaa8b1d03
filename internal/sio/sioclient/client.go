// Package sioclient is a small Socket.IO v5 client on Engine.IO v4, built on
// the codec the server uses (package internal/sio/wire). It is what the Go SDK,
// the benches and the server's tests speak to a joblib server with.
//
// One Client is one Engine.IO session joined to one namespace. [Dial] opens a
// websocket (or, with [Options.Upgrade], HTTP long-polling upgraded to a
// websocket, as browsers do), reads the Engine.IO open packet (session id, ping
// interval and timeout) and sends CONNECT with the auth payload to the
// namespace. From then on a read goroutine answers the server's pings, hands
// every event of the namespace to [Options.OnEvent] and every acknowledgement
// to the emit waiting for it. []byte arguments travel as binary attachments
// both ways.
//
// A packet the codec refuses (the same strict rules the server applies to its
// clients) ends the connection with an error, as the reference clients do.
package sioclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/zndraw/joblib/internal/sio/wire"
)

// Options configure [Dial]. The zero value joins namespace "/" without auth.
type Options struct {
	// Namespace to join ("" is "/").
	Namespace string
	// Auth is the CONNECT payload; it must encode to a JSON object. Nil sends none.
	Auth any
	// Header is sent with the handshake requests.
	Header http.Header
	// ReadLimit bounds one websocket message in bytes (default 16 MiB).
	ReadLimit int64
	// Upgrade opens the session with HTTP long-polling, joins the namespace
	// there and then upgrades to websocket, as browsers do.
	Upgrade bool
	// HTTPClient carries the long-polling requests of Upgrade
	// (default http.DefaultClient).
	HTTPClient *http.Client
	// OnEvent receives every event of the namespace, on the read goroutine:
	// it must not block (pings wait for it).
	OnEvent func(Event)
}

// Event is one event the server emitted to the namespace.
type Event struct {
	Name string
	// Args are the event's arguments as JSON; binary attachments stand in them
	// as base64 strings, which is how encoding/json decodes into []byte.
	Args []json.RawMessage
	// Attachments are the binary attachments, in placeholder order.
	Attachments [][]byte

	c     *Client
	id    uint64
	hasID bool
}

// Decode decodes the first len(out) arguments into out (nil skips one).
func (e Event) Decode(out ...any) error { return decodeArgs(e.Name, e.Args, out) }

// WantsAck reports whether the server asked for an acknowledgement.
func (e Event) WantsAck() bool { return e.hasID }

// Ack answers an event that asked for an acknowledgement.
func (e Event) Ack(ctx context.Context, args ...any) error {
	if !e.hasID {
		return fmt.Errorf("%s: the server asked for no acknowledgement", e.Name)
	}
	return e.c.send(ctx, wire.SIOAck, wire.SIOBinaryAck, e.id, true, args)
}

// Ack is the server's acknowledgement of an emit.
type Ack struct {
	// Args and Attachments as in Event.
	Args        []json.RawMessage
	Attachments [][]byte
}

// Decode decodes the first len(out) arguments into out (nil skips one).
func (a Ack) Decode(out ...any) error { return decodeArgs("ack", a.Args, out) }

func decodeArgs(what string, args []json.RawMessage, out []any) error {
	if len(args) < len(out) {
		return fmt.Errorf("%s: %d arguments, want %d", what, len(args), len(out))
	}
	for i, v := range out {
		if v == nil {
			continue
		}
		if err := json.Unmarshal(args[i], v); err != nil {
			return fmt.Errorf("%s argument %d: %w", what, i, err)
		}
	}
	return nil
}

// ConnectError is the server's CONNECT_ERROR: it refused the namespace.
type ConnectError struct {
	Message string
	// Data is the packet's "data" member, if any.
	Data json.RawMessage
}

func (e *ConnectError) Error() string { return "connect refused: " + e.Message }

// ErrClosedByServer ends a Client the server closed: an Engine.IO close or a
// Socket.IO DISCONNECT of the namespace.
var ErrClosedByServer = errors.New("closed by the server")

// ErrClosed is returned by emits after the connection ended for any reason;
// Err says which.
var ErrClosed = errors.New("socket closed")

// frameWriter is where the client's frames go: the websocket, or the
// long-polling transport before an upgrade.
type frameWriter interface {
	Write(ctx context.Context, typ websocket.MessageType, p []byte) error
}

// Client is one Socket.IO connection. Its methods are safe for concurrent use.
type Client struct {
	ns      string
	onEvent func(Event)

	ws  *websocket.Conn // nil until the websocket is open
	wmu sync.Mutex      // one packet's frames (header, then attachments) go out together
	w   frameWriter

	// Set by the handshake.
	sid          string
	id           string
	pid          string
	pingInterval time.Duration
	pingTimeout  time.Duration

	// Read-side state, owned by whoever reads (the handshake, then readLoop).
	partial *partialPacket
	opened  bool
	joined  bool

	mu     sync.Mutex
	nextID uint64
	acks   map[uint64]chan Ack
	err    error
	done   chan struct{}
}

// partialPacket is a binary packet waiting for its attachments.
type partialPacket struct {
	pkt  wire.SIOPacket
	atts [][]byte
}

func newClient(o Options, w frameWriter) *Client {
	ns := o.Namespace
	if ns == "" {
		ns = "/"
	}
	return &Client{ns: ns, onEvent: o.OnEvent, w: w, acks: map[uint64]chan Ack{}, done: make(chan struct{})}
}

// Dial connects to the joblib (or any Socket.IO v5) server at base, an
// http(s):// URL whose "/socket.io/" path serves Socket.IO, and joins the
// namespace. ctx bounds the handshake only. A refused CONNECT returns a
// *ConnectError.
func Dial(ctx context.Context, base string, o Options) (*Client, error) {
	auth, err := connectPayload(o.Auth)
	if err != nil {
		return nil, err
	}
	c := newClient(o, nil)
	wsURL := "ws" + strings.TrimPrefix(strings.TrimSuffix(base, "/"), "http") + "/socket.io/?EIO=4&transport=websocket"
	if o.Upgrade {
		if err := c.pollAndJoin(ctx, base, o, auth); err != nil {
			return nil, err
		}
		wsURL += "&sid=" + c.sid
	}
	ws, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: o.Header})
	if err != nil {
		return nil, fmt.Errorf("dial socket: %w", err)
	}
	ws.SetReadLimit(cmpOr(o.ReadLimit, 16<<20))
	fail := func(err error) (*Client, error) {
		_ = ws.CloseNow()
		return nil, err
	}
	if o.Upgrade {
		if err := upgrade(ctx, ws); err != nil {
			return fail(err)
		}
		c.wmu.Lock()
		c.w, c.ws = ws, ws
		c.wmu.Unlock()
	} else {
		c.w, c.ws = ws, ws
		if err := c.readUntil(ctx, func() bool { return c.opened }); err != nil {
			return fail(fmt.Errorf("engine.io open: %w", err))
		}
		if err := c.writeConnect(ctx, auth); err != nil {
			return fail(err)
		}
		if err := c.readUntil(ctx, func() bool { return c.joined }); err != nil {
			return fail(err)
		}
	}
	go c.readLoop()
	return c, nil
}

func cmpOr(v, def int64) int64 {
	if v > 0 {
		return v
	}
	return def
}

func connectPayload(auth any) (json.RawMessage, error) {
	if auth == nil {
		return nil, nil
	}
	b, err := json.Marshal(auth)
	if err != nil {
		return nil, fmt.Errorf("encode auth: %w", err)
	}
	if len(b) == 0 || b[0] != '{' {
		return nil, fmt.Errorf("auth must encode to a JSON object, not %.20s", b)
	}
	return b, nil
}

func (c *Client) writeConnect(ctx context.Context, auth json.RawMessage) error {
	pkt := wire.AppendSIO(nil, wire.SIOPacket{Type: wire.SIOConnect, Namespace: c.ns, Data: auth})
	if err := c.write(ctx, wire.AppendEIO(nil, wire.EIOPacket{Type: wire.EIOMessage, Data: pkt}), nil); err != nil {
		return fmt.Errorf("send connect: %w", err)
	}
	return nil
}

// readUntil reads websocket frames through handle until cond holds.
func (c *Client) readUntil(ctx context.Context, cond func() bool) error {
	for !cond() {
		typ, data, err := c.ws.Read(ctx)
		if err != nil {
			return err
		}
		if err := c.handle(ctx, typ, data); err != nil {
			return err
		}
	}
	return nil
}

func (c *Client) readLoop() {
	defer close(c.done)
	ctx := context.Background()
	for {
		typ, data, err := c.ws.Read(ctx)
		if err == nil {
			err = c.handle(ctx, typ, data)
		}
		if err != nil {
			c.mu.Lock()
			c.err = err
			c.mu.Unlock()
			_ = c.ws.CloseNow()
			return
		}
	}
}

// handle processes one frame from the server: the Engine.IO open, pings, a
// Socket.IO packet or one of its binary attachments.
func (c *Client) handle(ctx context.Context, typ websocket.MessageType, data []byte) error {
	if typ == websocket.MessageBinary {
		if c.partial == nil {
			return fmt.Errorf("%w: binary frame without a binary packet", wire.ErrInvalidPacket)
		}
		c.partial.atts = append(c.partial.atts, data)
		if len(c.partial.atts) < c.partial.pkt.Attachments {
			return nil
		}
		p := c.partial
		c.partial = nil
		return c.dispatch(p.pkt, p.atts)
	}
	if c.partial != nil {
		return fmt.Errorf("%w: text frame while %d attachments are due", wire.ErrInvalidPacket, c.partial.pkt.Attachments-len(c.partial.atts))
	}
	p, err := wire.DecodeEIO(data)
	if err != nil {
		return err
	}
	switch p.Type {
	case wire.EIOOpen:
		if c.opened {
			return fmt.Errorf("%w: a second open packet", wire.ErrInvalidPacket)
		}
		return c.open(p.Data)
	case wire.EIOPing:
		return c.write(ctx, wire.AppendEIO(nil, wire.EIOPacket{Type: wire.EIOPong, Data: p.Data}), nil)
	case wire.EIOClose:
		return ErrClosedByServer
	case wire.EIOPong, wire.EIONoop:
		return nil
	case wire.EIOMessage:
		pkt, err := wire.DecodeSIO(p.Data)
		if err != nil {
			return err
		}
		return c.packet(pkt)
	}
	return fmt.Errorf("%w: unexpected %v packet from the server", wire.ErrInvalidPacket, p.Type)
}

// open reads the Engine.IO handshake.
func (c *Client) open(data []byte) error {
	var hs struct {
		SID          string `json:"sid"`
		PingInterval int64  `json:"pingInterval"`
		PingTimeout  int64  `json:"pingTimeout"`
	}
	if err := json.Unmarshal(data, &hs); err != nil || hs.SID == "" {
		return fmt.Errorf("%w: open packet %.80q", wire.ErrInvalidPacket, data)
	}
	c.sid = hs.SID
	c.pingInterval = time.Duration(hs.PingInterval) * time.Millisecond
	c.pingTimeout = time.Duration(hs.PingTimeout) * time.Millisecond
	c.opened = true
	return nil
}

// packet processes one Socket.IO packet; those of other namespaces are
// ignored.
func (c *Client) packet(p wire.SIOPacket) error {
	if p.Namespace != c.ns {
		return nil
	}
	switch p.Type {
	case wire.SIOConnect:
		var a struct {
			SID string `json:"sid"`
			PID string `json:"pid"`
		}
		if p.Data != nil {
			_ = json.Unmarshal(p.Data, &a)
		}
		c.id, c.pid, c.joined = a.SID, a.PID, true
		return nil
	case wire.SIOConnectError:
		ce := &ConnectError{}
		var obj struct {
			Message string          `json:"message"`
			Data    json.RawMessage `json:"data"`
		}
		if json.Unmarshal(p.Data, &obj) == nil {
			ce.Message, ce.Data = obj.Message, obj.Data
		} else {
			_ = json.Unmarshal(p.Data, &ce.Message)
		}
		return ce
	case wire.SIODisconnect:
		return ErrClosedByServer
	case wire.SIOBinaryEvent, wire.SIOBinaryAck:
		if p.Attachments > 0 {
			c.partial = &partialPacket{pkt: p, atts: make([][]byte, 0, min(p.Attachments, 16))}
			return nil
		}
	}
	return c.dispatch(p, nil)
}

// dispatch delivers a complete event or ack.
func (c *Client) dispatch(p wire.SIOPacket, atts [][]byte) error {
	data := p.Data
	if p.Type == wire.SIOBinaryEvent || p.Type == wire.SIOBinaryAck {
		var err error
		if data, err = wire.InlineAttachments(data, atts); err != nil {
			return err
		}
	}
	if p.Type == wire.SIOEvent || p.Type == wire.SIOBinaryEvent {
		name, args, err := wire.SplitEvent(data)
		if err != nil {
			return err
		}
		if c.onEvent != nil {
			c.onEvent(Event{Name: name, Args: args, Attachments: atts, c: c, id: p.ID, hasID: p.HasID})
		}
		return nil
	}
	if !p.HasID {
		return fmt.Errorf("%w: %v without an id", wire.ErrInvalidPacket, p.Type)
	}
	var args []json.RawMessage
	if err := json.Unmarshal(data, &args); err != nil {
		return fmt.Errorf("%w: ack payload: %v", wire.ErrInvalidPacket, err)
	}
	c.mu.Lock()
	ch := c.acks[p.ID]
	delete(c.acks, p.ID)
	c.mu.Unlock()
	if ch != nil {
		ch <- Ack{Args: args, Attachments: atts}
	}
	return nil
}

// write sends one text frame and then the binary attachments, together.
func (c *Client) write(ctx context.Context, text []byte, atts [][]byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.w.Write(ctx, websocket.MessageText, text); err != nil {
		return err
	}
	for _, a := range atts {
		if err := c.w.Write(ctx, websocket.MessageBinary, a); err != nil {
			return err
		}
	}
	return nil
}

// send encodes args (with name first for events) as one packet of type
// plain, or binary when they hold []byte values, and writes it.
func (c *Client) send(ctx context.Context, plain, binary wire.SIOType, id uint64, hasID bool, args []any) error {
	var atts [][]byte
	data, err := json.Marshal(wire.Deconstruct(args, &atts))
	if err != nil {
		return fmt.Errorf("encode: %w", err)
	}
	p := wire.SIOPacket{Type: plain, Namespace: c.ns, ID: id, HasID: hasID, Data: data}
	if len(atts) > 0 {
		p.Type, p.Attachments = binary, len(atts)
	}
	return c.write(ctx, wire.AppendEIO(nil, wire.EIOPacket{Type: wire.EIOMessage, Data: wire.AppendSIO(nil, p)}), atts)
}

func eventArgs(name string, args []any) ([]any, error) {
	if wire.IsReservedEvent(name) {
		return nil, fmt.Errorf("%q is a reserved event name", name)
	}
	return append([]any{name}, args...), nil
}

// Emit sends an event without asking for an acknowledgement.
func (c *Client) Emit(ctx context.Context, name string, args ...any) error {
	all, err := eventArgs(name, args)
	if err != nil {
		return err
	}
	if err := c.send(ctx, wire.SIOEvent, wire.SIOBinaryEvent, 0, false, all); err != nil {
		return fmt.Errorf("emit %s: %w", name, err)
	}
	return nil
}

// Go sends an event that asks for an acknowledgement and returns the channel
// the acknowledgement arrives on (it never arrives if the connection ends
// first: watch Done).
func (c *Client) Go(ctx context.Context, name string, args ...any) (<-chan Ack, error) {
	_, ch, err := c.goID(ctx, name, args)
	return ch, err
}

func (c *Client) goID(ctx context.Context, name string, args []any) (uint64, <-chan Ack, error) {
	all, err := eventArgs(name, args)
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan Ack, 1)
	c.mu.Lock()
	id := c.nextID
	c.nextID++
	c.acks[id] = ch
	c.mu.Unlock()
	if err := c.send(ctx, wire.SIOEvent, wire.SIOBinaryEvent, id, true, all); err != nil {
		c.forget(id)
		return 0, nil, fmt.Errorf("emit %s: %w", name, err)
	}
	return id, ch, nil
}

func (c *Client) forget(id uint64) {
	c.mu.Lock()
	delete(c.acks, id)
	c.mu.Unlock()
}

// Call sends an event and waits for its acknowledgement, the end of the
// connection (ErrClosed) or of ctx.
func (c *Client) Call(ctx context.Context, name string, args ...any) (Ack, error) {
	id, ch, err := c.goID(ctx, name, args)
	if err != nil {
		return Ack{}, err
	}
	select {
	case a := <-ch:
		return a, nil
	case <-c.done:
		return Ack{}, fmt.Errorf("%s: %w", name, ErrClosed)
	case <-ctx.Done():
		c.forget(id)
		return Ack{}, ctx.Err()
	}
}

// SID is the Engine.IO session id.
func (c *Client) SID() string { return c.sid }

// ID is the Socket.IO socket id the server gave in its CONNECT answer.
func (c *Client) ID() string { return c.id }

// PID is the private session id of the CONNECT answer, which a client sends
// back to recover its session (empty when the server offers no recovery).
func (c *Client) PID() string { return c.pid }

// PingInterval and PingTimeout are the server's heartbeat settings from the
// open packet.
func (c *Client) PingInterval() time.Duration { return c.pingInterval }

// PingTimeout: see PingInterval.
func (c *Client) PingTimeout() time.Duration { return c.pingTimeout }

// Done is closed when the connection has ended and the read goroutine has
// returned.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err says why the connection ended (nil while it is open).
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Conn is the websocket, for tests and benches that send hand-made frames.
func (c *Client) Conn() *websocket.Conn { return c.ws }

// Close ends the connection with a websocket close handshake (the server
// sees a transport close) and waits for the read goroutine.
func (c *Client) Close() error {
	err := c.ws.Close(websocket.StatusNormalClosure, "")
	<-c.done
	return err
}

// Disconnect leaves the namespace (a Socket.IO DISCONNECT, which the server
// sees as the client's choice) and then closes the connection.
func (c *Client) Disconnect(ctx context.Context) error {
	pkt := wire.AppendSIO(nil, wire.SIOPacket{Type: wire.SIODisconnect, Namespace: c.ns})
	if err := c.write(ctx, wire.AppendEIO(nil, wire.EIOPacket{Type: wire.EIOMessage, Data: pkt}), nil); err != nil {
		_ = c.ws.CloseNow()
		return fmt.Errorf("send disconnect: %w", err)
	}
	return c.Close()
}

// Kill drops the connection without any goodbye, like a killed process. It
// does not wait for the read goroutine (Done does).
func (c *Client) Kill() { _ = c.ws.CloseNow() }
