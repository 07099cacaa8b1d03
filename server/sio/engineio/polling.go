package engineio

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/zndraw/joblib/internal/sio/wire"
)

// noopInterval is how long a GET waits during an upgrade before it is
// released with a noop packet.
const noopInterval = 100 * time.Millisecond

func writePayload(w http.ResponseWriter, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=UTF-8")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

func (srv *Server) servePollingHandshake(w http.ResponseWriter, r *http.Request) {
	c := srv.open(w, r, Polling)
	if c == nil {
		return
	}
	c.startHeartbeat()
	writePayload(w, c.openPacket().text)
}

// appendPolling appends the polling encoding of m (text, then "b"+base64
// binary messages), preceded by a separator unless body is empty.
func appendPolling(body []byte, m *Message) []byte {
	if m.text != nil {
		if len(body) > 0 {
			body = append(body, wire.RecordSeparator)
		}
		body = append(body, m.text...)
	}
	for _, b := range m.bins {
		if len(body) > 0 {
			body = append(body, wire.RecordSeparator)
		}
		body = wire.AppendEIO(body, wire.EIOPacket{Type: wire.EIOMessage, Data: b, Binary: true})
	}
	return body
}

// servePoll is a long-poll GET. It answers with every queued message (a due
// ping first) as soon as there is one; with a close packet once the session
// is closed (a noop if the client closed it itself); and with a noop when an
// upgrade needs the polling transport released. A GET while another is
// pending closes the session (transport error) and both get answers: 400
// for the second, a close packet for the first. A GET on an upgraded
// session gets 400, as in the reference server (transport mismatch).
func (c *Conn) servePoll(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	switch {
	case c.transport != Polling:
		c.mu.Unlock()
		writeError(w, http.StatusBadRequest, codeBadRequest)
		return
	case c.getActive:
		c.mu.Unlock()
		writeError(w, http.StatusBadRequest, codeBadRequest)
		c.close(ReasonTransportError)
		return
	}
	c.getActive = true
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.getActive = false
		c.mu.Unlock()
	}()

	// An http.Server WriteTimeout shorter than a long-poll would cut it.
	cfg := &c.srv.cfg
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(cfg.PingInterval + cfg.PingTimeout + cfg.WriteTimeout))

	var noop <-chan time.Time
	sawUnprobed := false
	for {
		c.mu.Lock()
		closed, clientClosed, probed, upgraded := c.closed, c.clientClosed, c.probed, c.transport != Polling
		c.mu.Unlock()
		if upgraded {
			// The websocket writer owns the queue now.
			writePayload(w, msgNoop)
			return
		}
		items, ping := c.take(nil)
		if len(items) > 0 || ping || closed {
			var body []byte
			if ping && !closed {
				body = appendPolling(body, msgPing)
			}
			for _, m := range items {
				body = appendPolling(body, m)
			}
			if closed {
				last := msgClose
				if clientClosed {
					last = msgNoop
				}
				body = appendPolling(body, &Message{text: last})
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
		case <-c.wake:
		case <-noop:
			writePayload(w, msgNoop)
			return
		case <-r.Context().Done():
			return
		}
	}
}

// servePost takes a payload of packets from the client. The body is read
// up to MaxPayload; past it the answer is 413 and the session closes.
func (c *Conn) servePost(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/octet-stream") {
		writeError(w, http.StatusBadRequest, codeBadRequest)
		return
	}
	c.mu.Lock()
	switch {
	case c.transport != Polling:
		c.mu.Unlock()
		writeError(w, http.StatusBadRequest, codeBadRequest)
		return
	case c.closed:
		c.mu.Unlock()
		writeError(w, http.StatusBadRequest, codeUnknownSID)
		return
	case c.postActive:
		c.mu.Unlock()
		writeError(w, http.StatusBadRequest, codeBadRequest)
		c.close(ReasonTransportError)
		return
	}
	c.postActive = true
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.postActive = false
		c.mu.Unlock()
	}()

	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, c.srv.cfg.MaxPayload))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			c.srv.cfg.OnReject(LimitPayloadBytes)
			writeError(w, http.StatusRequestEntityTooLarge, codeBadRequest)
			c.close(ReasonPayloadTooLarge)
			return
		}
		writeError(w, http.StatusBadRequest, codeBadRequest)
		return
	}
	pkts, err := wire.DecodePayload(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, codeBadRequest)
		c.closeFor(err)
		return
	}
	c.inMu.Lock()
	for _, p := range pkts {
		if err = c.handlePacket(p); err != nil {
			break
		}
	}
	c.inMu.Unlock()
	if err != nil {
		c.closeFor(err)
		if !errors.Is(err, errPeerClose) {
			writeError(w, http.StatusBadRequest, codeBadRequest)
			return
		}
	} else if c.closedByPeerError() {
		// The handler closed the session over this body's messages.
		writeError(w, http.StatusBadRequest, codeBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/html")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, "ok")
}
