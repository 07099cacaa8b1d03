package sio

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/zndraw/joblib/server/sio/wire"
)

// noopInterval is how long a GET waits during an upgrade before it is released
// with a noop packet.
const noopInterval = 100 * time.Millisecond

func writePayload(w http.ResponseWriter, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=UTF-8")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

func (srv *Server) servePollingHandshake(w http.ResponseWriter, r *http.Request) {
	s := srv.newSession(r, transportPolling)
	if s == nil {
		writeError(w, http.StatusServiceUnavailable, codeBadRequest)
		return
	}
	s.startTimers()
	writePayload(w, s.openPacket().text)
}

// appendPolling appends the polling encoding of m (text, then "b"+base64
// attachments), preceded by a separator unless body is empty.
func appendPolling(body []byte, m outMsg) []byte {
	if len(body) > 0 {
		body = append(body, wire.RecordSeparator)
	}
	body = append(body, m.text...)
	for _, b := range m.bins {
		body = append(body, wire.RecordSeparator)
		body = wire.AppendEIO(body, wire.EIOPacket{Type: wire.EIOMessage, Data: b, Binary: true})
	}
	return body
}

// servePoll is a long-poll GET: it answers with every queued packet as soon as
// there is one, with a close packet once the session is closed, and with a noop
// when an upgrade needs the polling transport released.
func (s *session) servePoll(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	switch {
	case s.transport != transportPolling:
		s.mu.Unlock()
		writeError(w, http.StatusBadRequest, codeBadRequest)
		return
	case s.getActive:
		s.mu.Unlock()
		writeError(w, http.StatusBadRequest, codeBadRequest)
		s.close(ReasonTransportError, false)
		return
	}
	s.getActive = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.getActive = false
		s.mu.Unlock()
	}()

	// An http.Server WriteTimeout shorter than a long-poll would cut it.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(s.srv.cfg.PingInterval + s.srv.cfg.PingTimeout + s.srv.cfg.WriteTimeout))

	var noop <-chan time.Time
	sawUnprobed := false
	for {
		s.mu.Lock()
		closed, clientClosed, probed, upgraded := s.closed, s.clientClosed, s.probed, s.transport != transportPolling
		s.mu.Unlock()
		if upgraded {
			// The websocket writer owns the queue now; pass on any wake-up we took.
			s.q.signal()
			writePayload(w, msgNoop)
			return
		}
		items := s.q.take(nil)
		if len(items) > 0 || closed {
			var body []byte
			for _, m := range items {
				body = appendPolling(body, m)
			}
			if closed {
				last := msgClose
				if clientClosed {
					last = msgNoop
				}
				body = appendPolling(body, outMsg{text: last})
				s.finishLinger()
			}
			writePayload(w, body)
			return
		}
		if probed {
			if sawUnprobed {
				writePayload(w, msgNoop)
				return
			}
			if noop == nil {
				t := time.NewTimer(noopInterval)
				defer t.Stop()
				noop = t.C
			}
		} else {
			sawUnprobed = true
		}
		select {
		case <-s.q.wake:
		case <-s.ctx.Done():
		case <-noop:
			writePayload(w, msgNoop)
			return
		case <-r.Context().Done():
			return
		}
	}
}

// finishLinger removes a closed session once its final packets went out.
func (s *session) finishLinger() {
	s.mu.Lock()
	if s.lingerTimer != nil {
		s.lingerTimer.Stop()
	}
	s.mu.Unlock()
	s.srv.removeSession(s)
}

// servePost takes a payload of packets from the client.
func (s *session) servePost(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/octet-stream") {
		writeError(w, http.StatusBadRequest, codeBadRequest)
		return
	}
	s.mu.Lock()
	switch {
	case s.transport != transportPolling:
		s.mu.Unlock()
		writeError(w, http.StatusBadRequest, codeBadRequest)
		return
	case s.closed:
		s.mu.Unlock()
		writeError(w, http.StatusBadRequest, codeUnknownSID)
		return
	case s.postActive:
		s.mu.Unlock()
		writeError(w, http.StatusBadRequest, codeBadRequest)
		s.close(ReasonTransportError, false)
		return
	}
	s.postActive = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.postActive = false
		s.mu.Unlock()
	}()

	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.srv.cfg.MaxPayload))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, codeBadRequest)
			s.close(ReasonPayloadTooLarge, false)
			return
		}
		writeError(w, http.StatusBadRequest, codeBadRequest)
		return
	}
	pkts, err := wire.DecodePayload(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, codeBadRequest)
		s.closeFor(err)
		return
	}
	s.inMu.Lock()
	for _, p := range pkts {
		if err = s.handlePacket(p); err != nil {
			break
		}
	}
	s.inMu.Unlock()
	if err != nil {
		s.closeFor(err)
		if !errors.Is(err, errPeerClose) {
			writeError(w, http.StatusBadRequest, codeBadRequest)
			return
		}
	}
	w.Header().Set("Content-Type", "text/html")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, "ok")
}
