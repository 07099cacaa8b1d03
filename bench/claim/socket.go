package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/coder/websocket"
)

// benchSocket is one worker's Socket.IO connection for -flow socket: a call
// sends an event and reads until its ack, answering the server's pings on
// the way. One call at a time (each bench worker owns its socket); server
// events the worker did not ask for are skipped.
type benchSocket struct {
	c      *websocket.Conn
	nextID int
}

func dialBenchSocket(ctx context.Context, base, token string) (*benchSocket, error) {
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+"/socket.io/?EIO=4&transport=websocket", nil)
	if err != nil {
		return nil, fmt.Errorf("dial socket: %w", err)
	}
	c.SetReadLimit(16 << 20)
	s := &benchSocket{c: c}
	if _, err := s.next(ctx, "0"); err != nil { // Engine.IO open
		s.close()
		return nil, err
	}
	auth, _ := json.Marshal(map[string]string{"token": token})
	if err := c.Write(ctx, websocket.MessageText, append([]byte("40"), auth...)); err != nil {
		s.close()
		return nil, fmt.Errorf("socket connect: %w", err)
	}
	if _, err := s.next(ctx, "40"); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// next reads frames until one starts with prefix (pings answered, other
// frames skipped) and returns the rest of it.
func (s *benchSocket) next(ctx context.Context, prefix string) (string, error) {
	for {
		_, msg, err := s.c.Read(ctx)
		if err != nil {
			return "", fmt.Errorf("socket read: %w", err)
		}
		m := string(msg)
		switch {
		case m == "2":
			if err := s.c.Write(ctx, websocket.MessageText, []byte("3")); err != nil {
				return "", fmt.Errorf("socket pong: %w", err)
			}
		case strings.HasPrefix(m, prefix):
			return m[len(prefix):], nil
		case strings.HasPrefix(m, "44"), m == "1":
			return "", fmt.Errorf("socket refused or closed: %s", m)
		}
	}
}

// call emits event with payload and decodes the ack's first argument into out.
func (s *benchSocket) call(event string, payload, out any) error {
	ctx := context.Background()
	b, err := json.Marshal([]any{event, payload})
	if err != nil {
		return err
	}
	id := strconv.Itoa(s.nextID)
	s.nextID++
	if err := s.c.Write(ctx, websocket.MessageText, append([]byte("42"+id), b...)); err != nil {
		return fmt.Errorf("send %s: %w", event, err)
	}
	rest, err := s.next(ctx, "43"+id+"[")
	if err != nil {
		return fmt.Errorf("%s: %w", event, err)
	}
	var args []json.RawMessage
	if err := json.Unmarshal([]byte("["+rest), &args); err != nil || len(args) == 0 {
		return fmt.Errorf("%s: bad ack %q", event, rest)
	}
	var status struct {
		OK     bool   `json:"ok"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}
	if err := json.Unmarshal(args[0], &status); err != nil || !status.OK {
		return fmt.Errorf("%s refused: %d %s", event, status.Status, status.Detail)
	}
	return json.Unmarshal(args[0], out)
}

func (s *benchSocket) close() { _ = s.c.CloseNow() }
