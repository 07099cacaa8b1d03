package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/coder/websocket"
)

// socket is a minimal Socket.IO v5 client over an Engine.IO v4 websocket:
// namespace "/", JSON events, acks; no binary attachments, no polling.
type socket struct {
	c      *websocket.Conn
	notify func(event string, args []json.RawMessage)

	mu     sync.Mutex
	nextID int
	acks   map[int]chan []json.RawMessage
	done   chan struct{} // closed when the read loop ends
	err    error         // why it ended
}

// dialSocket opens the websocket, answers the Engine.IO open and joins the
// namespace "/" with the token. notify receives each server event.
func dialSocket(ctx context.Context, base, token string, notify func(string, []json.RawMessage)) (*socket, error) {
	u := "ws" + strings.TrimPrefix(base, "http") + "/socket.io/?EIO=4&transport=websocket"
	h := http.Header{}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	c, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		return nil, fmt.Errorf("dial socket: %w", err)
	}
	c.SetReadLimit(16 << 20)
	fail := func(err error) (*socket, error) {
		_ = c.CloseNow()
		return nil, err
	}
	// Engine.IO open: "0{...}".
	_, msg, err := c.Read(ctx)
	if err != nil {
		return fail(fmt.Errorf("read engine.io open: %w", err))
	}
	if len(msg) == 0 || msg[0] != '0' {
		return fail(fmt.Errorf("engine.io open: unexpected %q", msg))
	}
	auth, _ := json.Marshal(map[string]string{"token": token})
	if err := c.Write(ctx, websocket.MessageText, append([]byte("40"), auth...)); err != nil {
		return fail(fmt.Errorf("send connect: %w", err))
	}
	for {
		_, msg, err = c.Read(ctx)
		if err != nil {
			return fail(fmt.Errorf("read connect answer: %w", err))
		}
		s := string(msg)
		switch {
		case s == "2":
			if err := c.Write(ctx, websocket.MessageText, []byte("3")); err != nil {
				return fail(fmt.Errorf("answer ping: %w", err))
			}
			continue
		case strings.HasPrefix(s, "40"):
		case strings.HasPrefix(s, "44"):
			return fail(fmt.Errorf("connect refused: %s", s[2:]))
		default:
			return fail(fmt.Errorf("connect: unexpected %q", s))
		}
		break
	}
	so := &socket{c: c, notify: notify, acks: map[int]chan []json.RawMessage{}, done: make(chan struct{})}
	go so.readLoop()
	return so, nil
}

func (s *socket) readLoop() {
	defer close(s.done)
	ctx := context.Background()
	for {
		_, msg, err := s.c.Read(ctx)
		if err != nil {
			s.mu.Lock()
			s.err = err
			s.mu.Unlock()
			return
		}
		m := string(msg)
		switch {
		case m == "2": // Engine.IO ping
			if err := s.c.Write(ctx, websocket.MessageText, []byte("3")); err != nil {
				s.mu.Lock()
				s.err = err
				s.mu.Unlock()
				_ = s.c.CloseNow()
				return
			}
		case m == "1" || strings.HasPrefix(m, "41"): // close / namespace disconnect
			s.mu.Lock()
			s.err = errors.New("closed by the server")
			s.mu.Unlock()
			_ = s.c.CloseNow()
			return
		case strings.HasPrefix(m, "42"), strings.HasPrefix(m, "43"):
			id, args, ok := parsePacket(m[2:])
			if !ok {
				continue
			}
			if m[1] == '3' {
				s.mu.Lock()
				ch := s.acks[id]
				delete(s.acks, id)
				s.mu.Unlock()
				if ch != nil {
					ch <- args
				}
				continue
			}
			if len(args) > 0 && s.notify != nil {
				var name string
				if json.Unmarshal(args[0], &name) == nil {
					s.notify(name, args[1:])
				}
			}
		}
	}
}

// parsePacket splits "<id?>[...]" into the ack id (-1 when absent) and the
// JSON array's elements.
func parsePacket(p string) (int, []json.RawMessage, bool) {
	i := strings.IndexByte(p, '[')
	if i < 0 {
		return 0, nil, false
	}
	id := -1
	if i > 0 {
		n, err := strconv.Atoi(p[:i])
		if err != nil {
			return 0, nil, false
		}
		id = n
	}
	var args []json.RawMessage
	if err := json.Unmarshal([]byte(p[i:]), &args); err != nil {
		return 0, nil, false
	}
	return id, args, true
}

// call emits event with payload and waits for its ack, decoding the first
// ack argument into out.
func (s *socket) call(ctx context.Context, event string, payload, out any) error {
	b, err := json.Marshal([]any{event, payload})
	if err != nil {
		return fmt.Errorf("encode %s: %w", event, err)
	}
	ch := make(chan []json.RawMessage, 1)
	s.mu.Lock()
	id := s.nextID
	s.nextID++
	s.acks[id] = ch
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.acks, id)
		s.mu.Unlock()
	}()
	pkt := append([]byte("42"+strconv.Itoa(id)), b...)
	if err := s.c.Write(ctx, websocket.MessageText, pkt); err != nil {
		return fmt.Errorf("send %s: %w", event, err)
	}
	select {
	case args := <-ch:
		if len(args) == 0 {
			return fmt.Errorf("%s: empty ack", event)
		}
		if out != nil {
			if err := json.Unmarshal(args[0], out); err != nil {
				return fmt.Errorf("decode %s ack: %w", event, err)
			}
		}
		return nil
	case <-s.done:
		return fmt.Errorf("%s: socket closed", event)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// close ends the connection.
func (s *socket) close() {
	_ = s.c.Close(websocket.StatusNormalClosure, "")
	<-s.done
}

// kill drops the connection without a close handshake (tests).
func (s *socket) kill() { _ = s.c.CloseNow() }
