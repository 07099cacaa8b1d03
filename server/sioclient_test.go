package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// sioClient is a minimal Socket.IO v5 client over websocket for tests: JSON
// events, acks, and answering pings.
type sioClient struct {
	t    testing.TB
	conn *websocket.Conn

	mu      sync.Mutex
	nextAck int
	acks    map[int]chan json.RawMessage
	events  []sioEvent
	notify  chan struct{}
	done    chan struct{}
	readErr error
}

type sioEvent struct {
	Name    string
	Payload map[string]any
	// Offset is a trailing string argument (connection state recovery).
	Offset string
	At     time.Time
}

// dialSIO connects and sends CONNECT with {"token": token}; it returns the
// CONNECT_ERROR message as an error if the server refuses.
func dialSIO(t testing.TB, baseURL, token string) (*sioClient, error) {
	t.Helper()
	c, _, err := dialSIOAuth(t, baseURL, map[string]any{"token": token})
	return c, err
}

// dialSIOAuth is dialSIO with any CONNECT auth payload; it also returns the
// CONNECT reply's payload (sid, and pid under connection state recovery).
// A namespace DISCONNECT from the server is recorded as an event named
// "disconnect".
func dialSIOAuth(t testing.TB, baseURL string, authPayload map[string]any) (*sioClient, map[string]any, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	u := "ws" + strings.TrimPrefix(baseURL, "http") + "/socket.io/?EIO=4&transport=websocket"
	conn, _, err := websocket.Dial(ctx, u, nil)
	if err != nil {
		return nil, nil, err
	}
	conn.SetReadLimit(1 << 20)
	_, open, err := conn.Read(ctx)
	if err != nil || len(open) == 0 || open[0] != '0' {
		conn.CloseNow()
		return nil, nil, fmt.Errorf("no open packet: %q %v", open, err)
	}
	auth, _ := json.Marshal(authPayload)
	if err := conn.Write(ctx, websocket.MessageText, append([]byte("40"), auth...)); err != nil {
		conn.CloseNow()
		return nil, nil, err
	}
	var reply map[string]any
	for {
		_, msg, err := conn.Read(ctx)
		if err != nil {
			conn.CloseNow()
			return nil, nil, err
		}
		s := string(msg)
		switch {
		case s == "2":
			_ = conn.Write(ctx, websocket.MessageText, []byte("3"))
			continue
		case strings.HasPrefix(s, "40"):
			_ = json.Unmarshal([]byte(s[2:]), &reply)
		case strings.HasPrefix(s, "44"):
			var e struct {
				Message string `json:"message"`
			}
			_ = json.Unmarshal([]byte(s[2:]), &e)
			conn.CloseNow()
			return nil, nil, errors.New(e.Message)
		default:
			conn.CloseNow()
			return nil, nil, fmt.Errorf("unexpected packet %q", s)
		}
		break
	}
	c := &sioClient{t: t, conn: conn, acks: map[int]chan json.RawMessage{}, notify: make(chan struct{}, 1), done: make(chan struct{})}
	go c.read()
	t.Cleanup(func() { c.conn.CloseNow() })
	return c, reply, nil
}

func mustDialSIO(t testing.TB, baseURL, token string) *sioClient {
	t.Helper()
	c, err := dialSIO(t, baseURL, token)
	if err != nil {
		t.Fatalf("socket.io connect: %v", err)
	}
	return c
}

func (c *sioClient) read() {
	defer close(c.done)
	for {
		_, msg, err := c.conn.Read(context.Background())
		if err != nil {
			c.mu.Lock()
			c.readErr = err
			c.mu.Unlock()
			return
		}
		s := string(msg)
		switch {
		case s == "2":
			_ = c.conn.Write(context.Background(), websocket.MessageText, []byte("3"))
		case s == "41":
			c.add(sioEvent{Name: "disconnect", At: time.Now()})
		case strings.HasPrefix(s, "42"):
			var arr []json.RawMessage
			if json.Unmarshal([]byte(s[2:]), &arr) != nil || len(arr) == 0 {
				continue
			}
			var ev sioEvent
			_ = json.Unmarshal(arr[0], &ev.Name)
			if len(arr) > 1 {
				_ = json.Unmarshal(arr[1], &ev.Payload)
			}
			if len(arr) > 2 {
				_ = json.Unmarshal(arr[len(arr)-1], &ev.Offset)
			}
			ev.At = time.Now()
			c.add(ev)
		case strings.HasPrefix(s, "43"):
			i := 2
			for i < len(s) && s[i] >= '0' && s[i] <= '9' {
				i++
			}
			id, _ := strconv.Atoi(s[2:i])
			var arr []json.RawMessage
			_ = json.Unmarshal([]byte(s[i:]), &arr)
			c.mu.Lock()
			ch := c.acks[id]
			delete(c.acks, id)
			c.mu.Unlock()
			if ch != nil {
				var first json.RawMessage
				if len(arr) > 0 {
					first = arr[0]
				}
				ch <- first
			}
		}
	}
}

func (c *sioClient) add(ev sioEvent) {
	c.mu.Lock()
	c.events = append(c.events, ev)
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

// call emits an event with an ack and returns the ack's first argument.
func (c *sioClient) call(name string, arg any) map[string]any {
	c.t.Helper()
	c.mu.Lock()
	id := c.nextAck
	c.nextAck++
	ch := make(chan json.RawMessage, 1)
	c.acks[id] = ch
	c.mu.Unlock()
	body, _ := json.Marshal([]any{name, arg})
	if err := c.conn.Write(context.Background(), websocket.MessageText, []byte("42"+strconv.Itoa(id)+string(body))); err != nil {
		c.t.Fatalf("emit %s: %v", name, err)
	}
	select {
	case raw := <-ch:
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			c.t.Fatalf("ack of %s: %q", name, raw)
		}
		return m
	case <-time.After(10 * time.Second):
		c.t.Fatalf("no ack for %s", name)
	}
	return nil
}

// mustCall is call that requires {"ok": true}.
func (c *sioClient) mustCall(name string, arg any) {
	c.t.Helper()
	if a := c.call(name, arg); a["ok"] != true {
		c.t.Fatalf("%s refused: %v", name, a)
	}
}

// waitEvent waits for an event with that name whose payload satisfies match
// (nil matches any) and returns it.
func (c *sioClient) waitEvent(name string, within time.Duration, match func(map[string]any) bool) sioEvent {
	c.t.Helper()
	deadline := time.After(within)
	for {
		c.mu.Lock()
		for _, ev := range c.events {
			if ev.Name == name && (match == nil || match(ev.Payload)) {
				c.mu.Unlock()
				return ev
			}
		}
		c.mu.Unlock()
		select {
		case <-c.notify:
		case <-deadline:
			c.t.Fatalf("no %s event within %s; got %v", name, within, c.names())
		case <-c.done:
			c.t.Fatalf("connection closed while waiting for %s: %v", name, c.readErr)
		}
	}
}

// eventsNamed returns what arrived so far under that name.
func (c *sioClient) eventsNamed(name string) []sioEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []sioEvent
	for _, ev := range c.events {
		if ev.Name == name {
			out = append(out, ev)
		}
	}
	return out
}

func (c *sioClient) names() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, ev := range c.events {
		out = append(out, ev.Name)
	}
	return out
}

// drop closes the TCP connection without any Socket.IO or websocket goodbye,
// like a killed process.
func (c *sioClient) drop() { c.conn.CloseNow() }
