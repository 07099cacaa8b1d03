package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/zndraw/joblib/internal/sio/sioclient"
)

// sioClient is the tests' Socket.IO connection (internal/sio/sioclient on
// websocket, namespace "/"): it records every event and waits for acks.
type sioClient struct {
	t    testing.TB
	cl   *sioclient.Client
	conn *websocket.Conn // for hand-made frames
	done <-chan struct{} // closed when the connection has ended

	mu       sync.Mutex
	events   []sioEvent
	notify   chan struct{}
	closedAt time.Time     // when the connection ended, noted as it ends
	closed   chan struct{} // closed once closedAt is set
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

// dialSIOAuth is dialSIO with any CONNECT auth payload; it also returns what
// the CONNECT reply named: sid, and pid under connection state recovery.
func dialSIOAuth(t testing.TB, baseURL string, auth map[string]any) (*sioClient, map[string]any, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := &sioClient{t: t, notify: make(chan struct{}, 1), closed: make(chan struct{})}
	cl, err := sioclient.Dial(ctx, baseURL, sioclient.Options{
		Auth:      auth,
		ReadLimit: 1 << 20,
		OnEvent:   c.record,
	})
	var refused *sioclient.ConnectError
	if errors.As(err, &refused) {
		return nil, nil, errors.New(refused.Message)
	}
	if err != nil {
		return nil, nil, err
	}
	c.cl, c.conn, c.done = cl, cl.Conn(), cl.Done()
	go func() {
		<-cl.Done()
		c.mu.Lock()
		c.closedAt = time.Now()
		c.mu.Unlock()
		close(c.closed)
	}()
	t.Cleanup(cl.Kill)
	return c, map[string]any{"sid": cl.ID(), "pid": cl.PID()}, nil
}

// waitClosed waits until the server ends the connection and returns when
// it ended.
func (c *sioClient) waitClosed(within time.Duration) time.Time {
	c.t.Helper()
	select {
	case <-c.closed:
	case <-time.After(within):
		c.t.Fatalf("the connection is still open after %s", within)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closedAt
}

func mustDialSIO(t testing.TB, baseURL, token string) *sioClient {
	t.Helper()
	c, err := dialSIO(t, baseURL, token)
	if err != nil {
		t.Fatalf("socket.io connect: %v", err)
	}
	return c
}

// record keeps an event (on the client's read loop).
func (c *sioClient) record(e sioclient.Event) {
	ev := sioEvent{Name: e.Name, At: time.Now()}
	if len(e.Args) > 0 {
		_ = json.Unmarshal(e.Args[0], &ev.Payload)
	}
	if len(e.Args) > 1 {
		_ = json.Unmarshal(e.Args[len(e.Args)-1], &ev.Offset)
	}
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
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := c.cl.Call(ctx, name, arg)
	if err != nil {
		c.t.Fatalf("%s: no ack: %v", name, err)
	}
	var m map[string]any
	if err := a.Decode(&m); err != nil {
		c.t.Fatalf("ack of %s: %s", name, a.Args)
	}
	return m
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
		case <-c.cl.Done():
			c.t.Fatalf("connection closed while waiting for %s: %v", name, c.cl.Err())
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
func (c *sioClient) drop() { c.cl.Kill() }
