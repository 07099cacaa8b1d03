package sio

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/zndraw/joblib/internal/sio/wire"
)

// refusal is an OnConnect error with data, like a JS `next(err)` with err.data.
type refusal struct{ data any }

func (r refusal) Error() string { return "not authorized" }
func (r refusal) Data() any     { return r.data }

// disconnectRecord is one OnDisconnect call.
type disconnectRecord struct {
	id     string
	reason string
}

// testHandler is the server side of every test: it mirrors what the official
// compliance suites' servers do (echo, ack, binary echo, auth echo) plus a few
// commands the client tests use.
type testHandler struct {
	srv *Server

	mu          sync.Mutex
	connects    int
	disconnects []disconnectRecord
	disconnCh   chan disconnectRecord
	onEvent     func(ctx context.Context, s *Socket, ev Event, ack AckFunc) bool // optional override
	onConnect   func(s *Socket) error                                            // optional
}

func newTestHandler() *testHandler {
	return &testHandler{disconnCh: make(chan disconnectRecord, 4096)}
}

func (h *testHandler) OnConnect(ctx context.Context, s *Socket, req *http.Request, auth json.RawMessage) error {
	var a map[string]any
	if len(auth) > 0 {
		if err := json.Unmarshal(auth, &a); err != nil {
			return err
		}
	}
	if tok, _ := a["token"].(string); tok == "bad" {
		return refusal{data: map[string]any{"reason": "bad token"}}
	}
	if h.onConnect != nil {
		if err := h.onConnect(s); err != nil {
			return err
		}
	}
	h.mu.Lock()
	h.connects++
	h.mu.Unlock()
	if auth != nil {
		_ = s.Emit("auth", auth)
	}
	return nil
}

// args reconstructs an event's arguments with their binary attachments.
func args(ev Event) ([]any, error) {
	out := make([]any, len(ev.Args))
	for i, a := range ev.Args {
		v, err := wire.Reconstruct(a, ev.Attachments)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

func (h *testHandler) OnEvent(ctx context.Context, s *Socket, ev Event, ack AckFunc) {
	if h.onEvent != nil && h.onEvent(ctx, s, ev, ack) {
		return
	}
	vals, err := args(ev)
	if err != nil {
		s.Close("bad attachments")
		return
	}
	str := func(i int) string {
		if i < len(vals) {
			v, _ := vals[i].(string)
			return v
		}
		return ""
	}
	switch ev.Name {
	case "message":
		_ = s.Emit("message-back", vals...)
	case "message-with-ack", "echo":
		if ack != nil {
			_ = ack(vals...)
		}
	case "join":
		err := s.Join(str(0))
		if ack != nil {
			if err != nil {
				_ = ack(err.Error())
			} else {
				_ = ack("joined")
			}
		}
	case "broadcast": // ["broadcast", room, payload]
		var payload any
		if len(vals) > 1 {
			payload = vals[1]
		}
		err := h.srv.EmitTo(str(0), "news", payload)
		if ack != nil {
			_ = ack(err == nil)
		}
	case "ask": // server→client ack: ask the client, report its answer
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		res, err := s.EmitWithAck(actx, "question", vals...)
		if err != nil {
			_ = s.Emit("answer", map[string]any{"error": err.Error()})
			return
		}
		var first any
		if len(res) > 0 {
			_ = json.Unmarshal(res[0], &first)
		}
		_ = s.Emit("answer", first)
	case "disconnect-me":
		s.Disconnect()
	case "close-me":
		s.Close("test close")
	}
}

func (h *testHandler) OnDisconnect(s *Socket, reason string) {
	rec := disconnectRecord{id: s.ID(), reason: reason}
	h.mu.Lock()
	h.disconnects = append(h.disconnects, rec)
	h.mu.Unlock()
	select {
	case h.disconnCh <- rec:
	default:
	}
}

// waitDisconnect waits for the next OnDisconnect.
func (h *testHandler) waitDisconnect(t *testing.T, timeout time.Duration) disconnectRecord {
	t.Helper()
	select {
	case rec := <-h.disconnCh:
		return rec
	case <-time.After(timeout):
		t.Fatalf("no OnDisconnect within %v", timeout)
		return disconnectRecord{}
	}
}

// testConfig pings every 300 ms like the compliance suites, but allows a pong
// 1 s, so that a test machine busy with -race and parallel tests does not cause
// ping timeouts; tests of the timeout itself use heartbeatConfig.
func testConfig() Config {
	return Config{
		PingInterval:   300 * time.Millisecond,
		PingTimeout:    time.Second,
		ConnectTimeout: 2 * time.Second,
		UpgradeTimeout: 2 * time.Second,
	}
}

// heartbeatConfig has the compliance suites' heartbeat: 300 ms / 200 ms.
func heartbeatConfig() Config {
	cfg := testConfig()
	cfg.PingTimeout = 200 * time.Millisecond
	return cfg
}

// adminHandler serves namespace "/admin": only the token "admin" connects.
type adminHandler struct {
	disconnCh chan disconnectRecord
}

func (h *adminHandler) OnConnect(ctx context.Context, s *Socket, req *http.Request, auth json.RawMessage) error {
	var a map[string]any
	_ = json.Unmarshal(auth, &a)
	if tok, _ := a["token"].(string); tok != "admin" {
		return refusal{data: map[string]any{"reason": "admin only"}}
	}
	return nil
}

func (h *adminHandler) OnEvent(ctx context.Context, s *Socket, ev Event, ack AckFunc) {
	vals, err := args(ev)
	if err != nil {
		s.Close("bad attachments")
		return
	}
	switch ev.Name {
	case "whoami":
		if ack != nil {
			_ = ack(s.Namespace().Name())
		}
	case "echo":
		if ack != nil {
			_ = ack(vals...)
		}
	case "join":
		_ = s.Join(vals[0].(string))
		if ack != nil {
			_ = ack("joined")
		}
	case "broadcast": // ["broadcast", room, payload]
		_ = s.Namespace().EmitTo(vals[0].(string), "news", vals[1])
		if ack != nil {
			_ = ack(true)
		}
	}
}

func (h *adminHandler) OnDisconnect(s *Socket, reason string) {
	select {
	case h.disconnCh <- disconnectRecord{id: s.ID(), reason: reason}:
	default:
	}
}

type testServer struct {
	srv   *Server
	h     *testHandler
	admin *adminHandler
	http  *httptest.Server
	url   string // http://127.0.0.1:port
}

// startServer runs a Server behind httptest and shuts both down at cleanup,
// failing the test if any server goroutine outlives Shutdown.
func startServer(t *testing.T, cfg Config, h *testHandler) *testServer {
	t.Helper()
	if h == nil {
		h = newTestHandler()
	}
	srv := New(cfg, h)
	h.srv = srv
	admin := &adminHandler{disconnCh: make(chan disconnectRecord, 64)}
	srv.Of("/admin", admin)
	mux := http.NewServeMux()
	mux.Handle("/socket.io/", srv)
	hs := httptest.NewServer(mux)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if n := srv.goroutines(); n != 0 {
			t.Errorf("%d server goroutines left after Shutdown", n)
		}
		hs.Close()
	})
	return &testServer{srv: srv, h: h, admin: admin, http: hs, url: hs.URL}
}

// newHTTPServer serves srv without the Shutdown cleanup of startServer.
func newHTTPServer(t *testing.T, srv *Server) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/socket.io/", srv)
	hs := httptest.NewServer(mux)
	t.Cleanup(func() {
		_ = srv.Shutdown(context.Background())
		hs.Close()
	})
	return hs
}
