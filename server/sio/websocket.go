package sio

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/coder/websocket"
	"github.com/zndraw/joblib/server/sio/wire"
)

// serveWebSocket runs a websocket-only session; the handler goroutine is the
// session's reader until the connection ends.
func (srv *Server) serveWebSocket(w http.ResponseWriter, r *http.Request) {
	if !srv.tr.start() {
		writeError(w, http.StatusServiceUnavailable, codeBadRequest)
		return
	}
	defer srv.tr.done()
	conn, err := websocket.Accept(w, r, srv.acceptOpts)
	if err != nil {
		srv.cfg.Logger.Debug("sio: websocket accept", "remote", r.RemoteAddr, "err", err)
		return
	}
	conn.SetReadLimit(srv.cfg.MaxPayload)
	s := srv.newSession(r, transportWebSocket)
	if s == nil {
		_ = conn.Close(websocket.StatusGoingAway, ReasonServerShutdown)
		return
	}
	_ = s.q.push(s.openPacket())
	srv.tr.add()
	go s.runWriter(conn)
	s.startTimers()
	s.readLoop(conn)
}

// serveUpgrade moves a polling session to websocket: "2probe" → "3probe", release
// the pending GET, wait for "5", then hand the queue to a websocket writer.
func (srv *Server) serveUpgrade(w http.ResponseWriter, r *http.Request, sid string) {
	s := srv.lookup(sid)
	if s == nil {
		writeError(w, http.StatusBadRequest, codeUnknownSID)
		return
	}
	s.mu.Lock()
	if s.closed || s.transport != transportPolling || s.upgrading {
		// Also the answer to a second websocket for an upgraded session.
		s.mu.Unlock()
		writeError(w, http.StatusBadRequest, codeBadRequest)
		return
	}
	s.upgrading = true
	s.mu.Unlock()
	committed := false
	defer func() {
		if !committed {
			s.mu.Lock()
			s.upgrading, s.probed = false, false
			s.mu.Unlock()
		}
	}()
	if !srv.tr.start() {
		writeError(w, http.StatusServiceUnavailable, codeBadRequest)
		return
	}
	defer srv.tr.done()

	conn, err := websocket.Accept(w, r, srv.acceptOpts)
	if err != nil {
		srv.cfg.Logger.Debug("sio: websocket accept (upgrade)", "remote", r.RemoteAddr, "err", err)
		return
	}
	conn.SetReadLimit(srv.cfg.MaxPayload)
	if !s.probe(conn) {
		_ = conn.Close(websocket.StatusPolicyViolation, "upgrade failed")
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = conn.Close(closeCode(ReasonServerShutdown), "session closed")
		return
	}
	s.transport = transportWebSocket
	s.upgrading, s.probed = false, false
	s.mu.Unlock()
	committed = true
	s.q.signal()
	srv.tr.add()
	go s.runWriter(conn)
	s.readLoop(conn)
}

// probe runs the upgrade handshake within UpgradeTimeout (or until the session
// closes). It reports whether the client sent the upgrade packet.
func (s *session) probe(conn *websocket.Conn) bool {
	ctx, cancel := context.WithTimeout(s.ctx, s.srv.cfg.UpgradeTimeout)
	defer cancel()
	typ, data, err := conn.Read(ctx)
	if err != nil || typ != websocket.MessageText || string(data) != "2probe" {
		return false
	}
	if err := conn.Write(ctx, websocket.MessageText, []byte("3probe")); err != nil {
		return false
	}
	s.mu.Lock()
	s.probed = true
	s.mu.Unlock()
	s.q.signal() // release a pending GET with a noop
	typ, data, err = conn.Read(ctx)
	return err == nil && typ == websocket.MessageText && string(data) == "5"
}

// readLoop reads packets until the connection ends, then closes the session.
func (s *session) readLoop(conn *websocket.Conn) {
	for {
		typ, data, err := conn.Read(s.ioCtx)
		if err != nil {
			s.close(readErrorReason(err), false)
			return
		}
		var p wire.EIOPacket
		if typ == websocket.MessageBinary {
			p = wire.EIOPacket{Type: wire.EIOMessage, Data: data, Binary: true}
		} else if p, err = wire.DecodeEIO(data); err != nil {
			s.closeFor(err)
			return
		}
		s.inMu.Lock()
		err = s.handlePacket(p)
		s.inMu.Unlock()
		if err != nil {
			s.closeFor(err)
			return
		}
	}
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

// runWriter is the connection's only writer: it keeps an event and its binary
// attachments contiguous, gives every frame its own WriteTimeout, and sends the
// close frame once the session is closed and (when flushing) drained.
func (s *session) runWriter(conn *websocket.Conn) {
	defer s.srv.tr.done()
	defer s.abort() // a dead writer must not leave the reader behind
	var batch []outMsg
	for {
		batch = s.q.take(batch)
		for _, m := range batch {
			if s.dropOutput.Load() {
				break
			}
			if err := s.writeMsg(conn, m); err != nil {
				s.close(ReasonTransportError, false)
				_ = conn.CloseNow()
				return
			}
		}
		if len(batch) > 0 && !s.dropOutput.Load() {
			continue
		}
		if s.q.isClosed() {
			code, text := s.closeStatus()
			_ = conn.Close(code, text)
			return
		}
		select {
		case <-s.q.wake:
		case <-s.ctx.Done():
		}
	}
}

func (s *session) writeMsg(conn *websocket.Conn, m outMsg) error {
	if err := s.writeFrame(conn, websocket.MessageText, m.text); err != nil {
		return err
	}
	for _, b := range m.bins {
		if err := s.writeFrame(conn, websocket.MessageBinary, b); err != nil {
			return err
		}
	}
	return nil
}

func (s *session) writeFrame(conn *websocket.Conn, typ websocket.MessageType, p []byte) error {
	ctx, cancel := context.WithTimeout(s.ioCtx, s.srv.cfg.WriteTimeout)
	defer cancel()
	return conn.Write(ctx, typ, p)
}
