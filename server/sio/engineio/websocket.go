package engineio

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/zndraw/joblib/internal/sio/wire"
)

// Buffer sizes of a websocket connection. net/http hands a hijacked
// connection 4 KiB read and write buffers that would live as long as the
// connection; these are enough for frame headers and small messages, and
// larger reads and writes bypass them.
const (
	wsReadBuffer  = 512
	wsWriteBuffer = 512
)

// smallBuffers makes the Hijack of a websocket handshake return small
// bufio buffers, and writes through wc (see frame.go).
type smallBuffers struct {
	http.ResponseWriter
	wc *wsConn // set by Hijack
}

func (w *smallBuffers) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *smallBuffers) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	// Keep whatever the client sent after its handshake.
	pending, _ := brw.Reader.Peek(brw.Reader.Buffered())
	pending = bytes.Clone(pending)
	size := max(wsReadBuffer, len(pending))
	r := bufio.NewReaderSize(io.MultiReader(bytes.NewReader(pending), conn), size)
	if len(pending) > 0 {
		_, _ = r.Peek(len(pending))
	}
	if err := brw.Writer.Flush(); err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	w.wc = newWSConn(conn)
	return conn, bufio.NewReadWriter(r, bufio.NewWriterSize(w.wc, wsWriteBuffer)), nil
}

// serveWebSocket opens a websocket-only session. The request's goroutine
// returns once the session runs: the session's reader is a goroutine of its
// own and its writer exists only while there is something to write.
func (srv *Server) serveWebSocket(w http.ResponseWriter, r *http.Request) {
	if !srv.tr.start() {
		writeErrorMessage(w, http.StatusServiceUnavailable, codeBadRequest, "Server shutting down")
		return
	}
	running := false
	defer func() {
		if !running {
			srv.tr.done()
		}
	}()
	c := srv.open(w, r, WebSocket)
	if c == nil {
		return
	}
	sb := &smallBuffers{ResponseWriter: w}
	ws, err := websocket.Accept(sb, r, srv.acceptOpts)
	if err != nil {
		srv.cfg.Logger.Debug("engineio: websocket accept", "remote", c.addr, "err", err)
		c.close(ReasonTransportError)
		return
	}
	ws.SetReadLimit(srv.cfg.MaxPayload)
	if !c.attach(ws, sb.wc) {
		_ = ws.CloseNow()
		return
	}
	c.startHeartbeat()
	running = true
	go c.readLoop(ws)
}

// attach makes ws the session's transport and starts writing what is queued.
func (c *Conn) attach(ws *websocket.Conn, wc *wsConn) bool {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false
	}
	c.transport = WebSocket
	c.ws = ws
	c.probe = nil
	c.upgrading, c.probed = false, false
	c.mu.Unlock()
	c.q.mu.Lock()
	c.q.ws = ws
	c.q.wc = wc
	start := (len(c.q.items) > 0 || c.q.ping.Load()) && c.q.claimWriterLocked()
	c.q.mu.Unlock()
	if start {
		c.startWriter()
	}
	return true
}

// serveUpgrade moves a polling session to websocket: "2probe" → "3probe",
// release the pending GET, wait for "5", then hand the queue to the
// websocket. A websocket for a session that is already upgraded (or
// upgrading) is accepted and closed at once, as the reference server does.
func (srv *Server) serveUpgrade(w http.ResponseWriter, r *http.Request, sid string) {
	c := srv.Lookup(sid)
	if c == nil {
		writeError(w, http.StatusBadRequest, codeUnknownSID)
		return
	}
	if !srv.tr.start() {
		writeErrorMessage(w, http.StatusServiceUnavailable, codeBadRequest, "Server shutting down")
		return
	}
	running := false
	defer func() {
		if !running {
			srv.tr.done()
		}
	}()
	c.mu.Lock()
	duplicate := c.closed || c.transport != Polling || c.upgrading
	if !duplicate {
		c.upgrading = true
	}
	c.mu.Unlock()
	sb := &smallBuffers{ResponseWriter: w}
	ws, err := websocket.Accept(sb, r, srv.acceptOpts)
	if err != nil {
		srv.cfg.Logger.Debug("engineio: websocket accept (upgrade)", "remote", c.addr, "err", err)
		if !duplicate {
			c.endUpgrade()
		}
		return
	}
	if duplicate {
		_ = ws.Close(websocket.StatusNoStatusRcvd, "")
		return
	}
	ws.SetReadLimit(srv.cfg.MaxPayload)
	if !c.probeUpgrade(ws) {
		c.endUpgrade()
		_ = ws.Close(websocket.StatusPolicyViolation, "upgrade failed")
		return
	}
	if !c.attach(ws, sb.wc) {
		_ = ws.Close(CloseCode(ReasonServerShutdown), "session closed")
		return
	}
	running = true
	go c.readLoop(ws)
}

func (c *Conn) endUpgrade() {
	c.mu.Lock()
	c.upgrading, c.probed, c.probe = false, false, nil
	c.mu.Unlock()
	c.signal()
}

// probeUpgrade runs the upgrade handshake within UpgradeTimeout (or until
// the session closes). It reports whether the client sent the upgrade packet.
func (c *Conn) probeUpgrade(ws *websocket.Conn) bool {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false
	}
	c.probe = ws
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), c.srv.cfg.UpgradeTimeout)
	defer cancel()
	typ, data, err := ws.Read(ctx)
	if err != nil || typ != websocket.MessageText || string(data) != "2probe" {
		return false
	}
	if err := ws.Write(ctx, websocket.MessageText, []byte("3probe")); err != nil {
		return false
	}
	c.mu.Lock()
	c.probed = true
	c.mu.Unlock()
	c.signal() // release a pending GET with a noop
	typ, data, err = ws.Read(ctx)
	return err == nil && typ == websocket.MessageText && string(data) == "5"
}

// readLoop reads packets until the connection ends, then closes the session.
func (c *Conn) readLoop(ws *websocket.Conn) {
	defer c.srv.tr.done()
	for {
		typ, data, err := ws.Read(context.Background())
		if err != nil {
			reason := readErrorReason(err)
			if reason == ReasonPayloadTooLarge {
				c.srv.cfg.OnReject(LimitPayloadBytes)
			}
			c.close(reason)
			return
		}
		var p wire.EIOPacket
		if typ == websocket.MessageBinary {
			p = wire.EIOPacket{Type: wire.EIOMessage, Data: data, Binary: true}
		} else if p, err = wire.DecodeEIO(data); err != nil {
			c.closeFor(err)
			return
		}
		if p.Type == wire.EIOMessage {
			err = c.handleOffStack(p)
		} else {
			c.inMu.Lock()
			err = c.handlePacket(p)
			c.inMu.Unlock()
		}
		if err != nil {
			c.closeFor(err)
			return
		}
	}
}

// handleOffStack hands a message to Handler.OnMessage on a short-lived
// goroutine and waits for it. Decoding a message (JSON, reflection) needs
// deep stacks; run on the reader, it would grow the reader's stack for the
// connection's lifetime, and an idle connection would pay for its busiest
// moment.
func (c *Conn) handleOffStack(p wire.EIOPacket) error {
	done := make(chan error, 1)
	go func() {
		c.inMu.Lock()
		defer c.inMu.Unlock()
		done <- c.handlePacket(p)
	}()
	return <-done
}

func readErrorReason(err error) string {
	switch {
	case websocket.CloseStatus(err) != -1, errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, net.ErrClosed), errors.Is(err, context.Canceled):
		return ReasonTransportClose
	case strings.Contains(err.Error(), "read limited at"):
		// coder/websocket has already answered with close code 1009.
		return ReasonPayloadTooLarge
	}
	return ReasonTransportError
}

func (c *Conn) startWriter() {
	c.srv.tr.add()
	c.srv.writers.Add(1)
	go c.runWriter()
}

// runWriter drains the queue to the websocket and exits when it is empty (a
// later push starts another). It writes everything queued at once (one
// writev), keeps a message and its binary messages contiguous, lets a due
// ping jump ahead of queued messages, and sends the close frame once the
// session is closed.
func (c *Conn) runWriter() {
	defer c.srv.tr.done()
	c.q.mu.Lock()
	ws, wc := c.q.ws, c.q.wc
	c.q.mu.Unlock()
	var batch []*Message
	var bufs net.Buffers
	for {
		var ping bool
		batch, ping = c.take(batch)
		if c.dropOutput.Load() {
			batch, ping = batch[:0], false
		}
		if wc == nil {
			// Not reached: every websocket is accepted through smallBuffers.
			if ping && !c.write(ws, websocket.MessageText, msgPing.text) {
				return
			}
			for _, m := range batch {
				if c.dropOutput.Load() || !c.writeMsg(ws, m) {
					break
				}
			}
		} else if ping || len(batch) > 0 {
			clear(bufs)
			bufs = bufs[:0]
			rest := batch
			if ping {
				// A due ping jumps the queue, but never the open packet: a
				// heartbeat that fires before this writer's first turn
				// (a short ping interval, a starved machine) would
				// otherwise reach the client before the handshake.
				if len(rest) > 0 && rest[0].open {
					bufs = append(bufs, rest[0].wsFrames())
					rest = rest[1:]
				}
				bufs = append(bufs, msgPing.wsFrames())
			}
			for _, m := range rest {
				bufs = append(bufs, m.wsFrames())
			}
			if !c.writeFrames(ws, wc, bufs) {
				return
			}
		}
		if len(batch) > 0 || ping {
			continue
		}
		c.q.mu.Lock()
		if len(c.q.items) > 0 || (c.q.ping.Load() && !c.q.closed) {
			c.q.mu.Unlock()
			continue
		}
		closed := c.q.closed
		if !closed {
			c.q.writing = false
		}
		c.q.mu.Unlock()
		if closed {
			code, text := c.closeStatus()
			_ = ws.Close(code, text)
			c.mu.Lock()
			if c.grace != nil {
				c.grace.Stop()
			}
			c.mu.Unlock()
		}
		return
	}
}

// writeFrames writes bufs in full; a stuck write is found by the heartbeat
// (see Config.WriteTimeout).
func (c *Conn) writeFrames(ws *websocket.Conn, wc *wsConn, bufs net.Buffers) bool {
	c.writeSince.Store(time.Now().UnixNano())
	err := wc.writeBlocking(bufs)
	c.writeSince.Store(0)
	if err != nil {
		c.close(ReasonTransportError)
		_ = ws.CloseNow()
		return false
	}
	return true
}

func (c *Conn) writeMsg(ws *websocket.Conn, m *Message) bool {
	if m.text != nil && !c.write(ws, websocket.MessageText, m.text) {
		return false
	}
	for _, b := range m.bins {
		if !c.write(ws, websocket.MessageBinary, b) {
			return false
		}
	}
	return true
}

// write writes one frame without a per-frame context: a stuck write is
// found by the heartbeat (see Config.WriteTimeout).
func (c *Conn) write(ws *websocket.Conn, typ websocket.MessageType, p []byte) bool {
	c.writeSince.Store(time.Now().UnixNano())
	err := ws.Write(context.Background(), typ, p)
	c.writeSince.Store(0)
	if err != nil {
		c.close(ReasonTransportError)
		_ = ws.CloseNow()
		return false
	}
	return true
}
