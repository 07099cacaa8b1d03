package sioclient_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/zndraw/joblib/internal/sio/sioclient"
	"github.com/zndraw/joblib/server/sio"
)

// The client against the repository's Socket.IO server, both on the one
// codec.

const wait = 5 * time.Second

// echo serves "/": "echo" acknowledges its arguments back, "ping-me" makes the
// server emit "pinged" with the arguments to the socket, "ask" makes it emit
// "question" asking for an ack and report the answer as "answered".
type echo struct {
	mu      sync.Mutex
	ids     []string
	reasons chan string
}

func (h *echo) OnConnect(ctx context.Context, s *sio.Socket, req *http.Request, auth json.RawMessage) error {
	h.mu.Lock()
	h.ids = append(h.ids, s.ID())
	h.mu.Unlock()
	return nil
}

func (h *echo) OnEvent(ctx context.Context, s *sio.Socket, ev sio.Event, ack sio.AckFunc) {
	args := make([]any, len(ev.Args))
	for i, a := range ev.Args {
		args[i] = a
	}
	// The test sends its binary arguments last: echo them as binary.
	for i, b := range ev.Attachments {
		args[len(ev.Args)-len(ev.Attachments)+i] = b
	}
	switch ev.Name {
	case "echo":
		if ack != nil {
			_ = ack(args...)
		}
	case "ping-me":
		_ = s.Emit("pinged", args...)
	case "bytes-please":
		_ = s.Emit("bytes", []byte{0, 1, 2, 0xff}, "after")
	case "ask":
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			got, err := s.EmitWithAck(ctx, "question", "what?")
			if err != nil {
				return
			}
			_ = s.Emit("answered", got[0])
		}()
	case "kick":
		go s.Disconnect()
	}
}

func (h *echo) OnDisconnect(s *sio.Socket, reason string) {
	select {
	case h.reasons <- reason:
	default:
	}
}

// admin serves "/admin" for auth {"token":"secret"} only.
type admin struct{}

func (admin) OnConnect(_ context.Context, _ *sio.Socket, _ *http.Request, auth json.RawMessage) error {
	if string(auth) == `{"token":"secret"}` {
		return nil
	}
	return errors.New("admins only")
}

func (admin) OnEvent(ctx context.Context, s *sio.Socket, ev sio.Event, ack sio.AckFunc) {
	if ack != nil {
		_ = ack("admin:" + ev.Name)
	}
}
func (admin) OnDisconnect(s *sio.Socket, reason string) {}

func start(t *testing.T, cfg sio.Config) (*echo, string) {
	t.Helper()
	h := &echo{reasons: make(chan string, 4)}
	srv := sio.New(cfg, h)
	srv.Of("/admin", admin{})
	mux := http.NewServeMux()
	mux.Handle("/socket.io/", srv)
	hs := httptest.NewServer(mux)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		_ = srv.Shutdown(ctx)
		hs.Close()
	})
	return h, hs.URL
}

func dial(t *testing.T, url string, o sioclient.Options) *sioclient.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	c, err := sioclient.Dial(ctx, url, o)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(c.Kill)
	return c
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	return c
}

// events collects what OnEvent receives.
type events struct {
	ch chan sioclient.Event
}

func newEvents() *events { return &events{ch: make(chan sioclient.Event, 16)} }

func (e *events) on(ev sioclient.Event) { e.ch <- ev }

func (e *events) next(t *testing.T) sioclient.Event {
	t.Helper()
	select {
	case ev := <-e.ch:
		return ev
	case <-time.After(wait):
		t.Fatal("no event")
	}
	return sioclient.Event{}
}

// The handshake: session id and heartbeat from the open packet, the socket
// id from the CONNECT answer; the client answers pings, so a session with a
// 400 ms ping timeout outlives three times that in pings.
func TestHandshakeAndPings(t *testing.T) {
	t.Parallel()
	h, url := start(t, sio.Config{PingInterval: 25 * time.Millisecond, PingTimeout: 400 * time.Millisecond})
	c := dial(t, url, sioclient.Options{})
	if c.SID() == "" || c.PingInterval() != 25*time.Millisecond || c.PingTimeout() != 400*time.Millisecond {
		t.Fatalf("sid %q, ping interval %v, timeout %v", c.SID(), c.PingInterval(), c.PingTimeout())
	}
	h.mu.Lock()
	ids := h.ids
	h.mu.Unlock()
	if len(ids) != 1 || ids[0] != c.ID() || c.ID() == c.SID() {
		t.Fatalf("socket id %q, server saw %v (session %q)", c.ID(), ids, c.SID())
	}
	time.Sleep(1300 * time.Millisecond) // ~50 pings; one unanswered is fatal after 425 ms
	if _, err := c.Call(ctx(t), "echo", 1); err != nil {
		t.Fatalf("after the pings: %v (%v)", err, c.Err())
	}
}

// Emits with and without an ack, JSON and binary arguments both ways, and an
// ack the server asks for.
func TestEmitsAcksAndAttachments(t *testing.T) {
	t.Parallel()
	_, url := start(t, sio.Config{})
	evs := newEvents()
	c := dial(t, url, sioclient.Options{OnEvent: evs.on})

	blob, blob2 := []byte{0xde, 0xad, 0, 0xbe, 0xef}, []byte("second")
	a, err := c.Call(ctx(t), "echo", map[string]any{"n": 1}, blob, blob2)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]int
	var b, b2 []byte
	if err := a.Decode(&m, &b, &b2); err != nil || m["n"] != 1 || !bytes.Equal(b, blob) || !bytes.Equal(b2, blob2) {
		t.Fatalf("ack %s: %v %v %x %x", a.Args, err, m, b, b2)
	}
	if len(a.Attachments) != 2 || !bytes.Equal(a.Attachments[0], blob) || !bytes.Equal(a.Attachments[1], blob2) {
		t.Fatalf("ack attachments %x", a.Attachments)
	}

	if err := c.Emit(ctx(t), "ping-me", "hello"); err != nil {
		t.Fatal(err)
	}
	ev := evs.next(t)
	var s string
	if ev.Name != "pinged" || ev.Decode(&s) != nil || s != "hello" || ev.WantsAck() {
		t.Fatalf("event %s %s (ack asked: %v)", ev.Name, ev.Args, ev.WantsAck())
	}

	if err := c.Emit(ctx(t), "bytes-please"); err != nil {
		t.Fatal(err)
	}
	ev = evs.next(t)
	var after string
	if ev.Name != "bytes" || ev.Decode(&b, &after) != nil || !bytes.Equal(b, []byte{0, 1, 2, 0xff}) || after != "after" || len(ev.Attachments) != 1 {
		t.Fatalf("binary event %s %s %x", ev.Name, ev.Args, ev.Attachments)
	}

	// The server asks: the handler answers from OnEvent.
	answering := make(chan sioclient.Event, 4)
	c2 := dial(t, url, sioclient.Options{OnEvent: func(ev sioclient.Event) {
		if ev.Name == "question" {
			if err := ev.Ack(context.Background(), "42"); err != nil {
				t.Error(err)
			}
			return
		}
		answering <- ev
	}})
	if err := c2.Emit(ctx(t), "ask"); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-answering:
		if ev.Name != "answered" || string(ev.Args[0]) != `"42"` {
			t.Fatalf("got %s %s", ev.Name, ev.Args)
		}
	case <-time.After(wait):
		t.Fatal("the server never got the answer")
	}

	if _, err := c.Go(ctx(t), "connect"); err == nil {
		t.Fatal("a reserved event name was sent")
	}
}

// CONNECT carries the auth to the named namespace; a refusal is a
// *ConnectError with the server's message.
func TestNamespaceAuth(t *testing.T) {
	t.Parallel()
	_, url := start(t, sio.Config{})
	c := dial(t, url, sioclient.Options{Namespace: "/admin", Auth: map[string]string{"token": "secret"}})
	a, err := c.Call(ctx(t), "who")
	var s string
	if err != nil || a.Decode(&s) != nil || s != "admin:who" {
		t.Fatalf("ack %v %v", a.Args, err)
	}
	_, err = sioclient.Dial(ctx(t), url, sioclient.Options{Namespace: "/admin", Auth: map[string]string{"token": "guess"}})
	var ce *sioclient.ConnectError
	if !errors.As(err, &ce) || ce.Message != "admins only" {
		t.Fatalf("wrong auth: %v", err)
	}
	_, err = sioclient.Dial(ctx(t), url, sioclient.Options{Namespace: "/nope"})
	if !errors.As(err, &ce) || ce.Message != "Invalid namespace" {
		t.Fatalf("unknown namespace: %v", err)
	}
}

// How each way of leaving looks to the server, and a server-side
// disconnect to the client.
func TestClose(t *testing.T) {
	t.Parallel()
	h, url := start(t, sio.Config{})
	reason := func() string {
		select {
		case r := <-h.reasons:
			return r
		case <-time.After(wait):
			t.Fatal("no disconnect on the server")
		}
		return ""
	}
	if err := dial(t, url, sioclient.Options{}).Close(); err != nil {
		t.Fatal(err)
	}
	if r := reason(); r != sio.ReasonTransportClose {
		t.Fatalf("Close: %q", r)
	}
	if err := dial(t, url, sioclient.Options{}).Disconnect(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if r := reason(); r != sio.ReasonClientNamespaceDisconnect {
		t.Fatalf("Disconnect: %q", r)
	}
	c := dial(t, url, sioclient.Options{})
	if err := c.Emit(ctx(t), "kick"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Done():
	case <-time.After(wait):
		t.Fatal("still open after the server's disconnect")
	}
	if !errors.Is(c.Err(), sioclient.ErrClosedByServer) {
		t.Fatalf("err %v", c.Err())
	}
	if _, err := c.Call(ctx(t), "echo"); err == nil {
		t.Fatal("a call on a closed client succeeded")
	}
}

// Upgrade opens with long-polling, joins there and moves to websocket.
func TestUpgrade(t *testing.T) {
	t.Parallel()
	_, url := start(t, sio.Config{PingInterval: 25 * time.Millisecond, PingTimeout: 400 * time.Millisecond})
	evs := newEvents()
	c := dial(t, url, sioclient.Options{Upgrade: true, OnEvent: evs.on})
	if c.Conn() == nil {
		t.Fatal("no websocket after the upgrade")
	}
	time.Sleep(100 * time.Millisecond)
	if err := c.Emit(ctx(t), "ping-me", []byte("x")); err != nil {
		t.Fatal(err)
	}
	var b []byte
	if ev := evs.next(t); ev.Name != "pinged" || ev.Decode(&b) != nil || string(b) != "x" {
		t.Fatalf("event %s %s", ev.Name, ev.Args)
	}
}
