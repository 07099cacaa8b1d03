package engineio

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// Raw Engine.IO v4 tests against the protocol document: handshake, messages
// (text and binary), heartbeat order, session budgets and hints. The server
// under test echoes every message.

const ioTimeout = 5 * time.Second

type echoHandler struct {
	mu      sync.Mutex
	opened  int
	reasons []string
	closed  chan string
}

func newEcho() *echoHandler { return &echoHandler{closed: make(chan string, 1024)} }

func (h *echoHandler) OnOpen(c *Conn, r *http.Request) error {
	if r.URL.Query().Get("refuse") != "" {
		return errRefused
	}
	h.mu.Lock()
	h.opened++
	h.mu.Unlock()
	return nil
}

func (h *echoHandler) OnMessage(c *Conn, data []byte, binary bool) {
	if binary {
		_ = c.Send(NewBinaryMessage(data))
		return
	}
	_ = c.Send(NewMessage(data))
}

func (h *echoHandler) OnClose(c *Conn, reason string) {
	h.mu.Lock()
	h.reasons = append(h.reasons, reason)
	h.mu.Unlock()
	select {
	case h.closed <- reason:
	default:
	}
}

type refusedError struct{}

func (refusedError) Error() string { return "refused" }

var errRefused = refusedError{}

func start(t *testing.T, cfg Config, h Handler) (*Server, *httptest.Server) {
	t.Helper()
	if cfg.PingInterval == 0 {
		cfg.PingInterval = 300 * time.Millisecond
		cfg.PingTimeout = time.Second
	}
	srv := NewServer(cfg, h)
	hs := httptest.NewServer(srv)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if n := srv.Goroutines(); n != 0 {
			t.Errorf("%d goroutines after Shutdown", n)
		}
		hs.Close()
	})
	return srv, hs
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func post(t *testing.T, url, body string) (int, string) {
	t.Helper()
	res, err := http.Post(url, "text/plain;charset=UTF-8", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func handshake(t *testing.T, base string) string {
	t.Helper()
	status, body := get(t, base+"/?EIO=4&transport=polling")
	if status != 200 || !strings.HasPrefix(body, "0{") {
		t.Fatalf("handshake: %d %q", status, body)
	}
	var open struct{ SID string }
	if err := json.Unmarshal([]byte(body[1:]), &open); err != nil {
		t.Fatal(err)
	}
	return open.SID
}

func dial(t *testing.T, base, query string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+"/?EIO=4&transport=websocket"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CloseNow() })
	return c
}

func read(t *testing.T, c *websocket.Conn) (websocket.MessageType, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	typ, b, err := c.Read(ctx)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return typ, string(b)
}

func write(t *testing.T, c *websocket.Conn, typ websocket.MessageType, s string) {
	t.Helper()
	if err := c.Write(context.Background(), typ, []byte(s)); err != nil {
		t.Fatal(err)
	}
}

func TestWebSocketEcho(t *testing.T) {
	t.Parallel()
	_, hs := start(t, Config{}, newEcho())
	c := dial(t, hs.URL, "")
	if _, open := read(t, c); !strings.HasPrefix(open, `0{"sid":`) {
		t.Fatalf("open %q", open)
	}
	write(t, c, websocket.MessageText, "4hello")
	if typ, got := read(t, c); typ != websocket.MessageText || got != "4hello" {
		t.Fatalf("echo %v %q", typ, got)
	}
	write(t, c, websocket.MessageBinary, "\x00\x01\xff")
	if typ, got := read(t, c); typ != websocket.MessageBinary || got != "\x00\x01\xff" {
		t.Fatalf("binary echo %v %q", typ, got)
	}
}

func TestPollingEcho(t *testing.T) {
	t.Parallel()
	_, hs := start(t, Config{}, newEcho())
	sid := handshake(t, hs.URL)
	url := hs.URL + "/?EIO=4&transport=polling&sid=" + sid
	if status, body := post(t, url, "4hello\x1ebAAH/"); status != 200 || body != "ok" {
		t.Fatalf("POST %d %q", status, body)
	}
	if status, body := get(t, url); status != 200 || body != "4hello\x1ebAAH/" {
		t.Fatalf("GET %d %q", status, body)
	}
}

func TestOpenRefused(t *testing.T) {
	t.Parallel()
	_, hs := start(t, Config{}, newEcho())
	if status, body := get(t, hs.URL+"/?EIO=4&transport=polling&refuse=1"); status != 403 || !strings.Contains(body, `"code":4`) {
		t.Fatalf("refused handshake: %d %q", status, body)
	}
}

// TestSessionIDGenerator: ids come from Config.SessionID (a cluster embeds
// its node there) and route polling requests.
func TestSessionIDGenerator(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	gen := func() string { return "node7." + RandomID() + "." + string(rune('a'+n.Add(1)%26)) }
	_, hs := start(t, Config{SessionID: gen}, newEcho())
	sid := handshake(t, hs.URL)
	if !strings.HasPrefix(sid, "node7.") {
		t.Fatalf("sid %q does not come from the generator", sid)
	}
	url := hs.URL + "/?EIO=4&transport=polling&sid=" + sid
	post(t, url, "4x")
	if _, body := get(t, url); body != "4x" {
		t.Fatalf("GET %q", body)
	}
}

// TestSessionBudgets: handshakes past the total and per-address budgets are
// refused (503 and 429) and counted; closing a session frees its slot.
func TestSessionBudgets(t *testing.T) {
	t.Parallel()
	var rejected sync.Map
	count := func(limit string) {
		v, _ := rejected.LoadOrStore(limit, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	got := func(limit string) int64 {
		v, ok := rejected.Load(limit)
		if !ok {
			return 0
		}
		return v.(*atomic.Int64).Load()
	}
	_, hs := start(t, Config{MaxSessionsPerAddr: 2, MaxSessions: 1000, OnReject: count}, newEcho())
	sid1 := handshake(t, hs.URL)
	handshake(t, hs.URL)
	if res, err := http.Get(hs.URL + "/?EIO=4&transport=polling"); err != nil || res.StatusCode != http.StatusTooManyRequests || res.Header.Get("Retry-After") == "" {
		t.Fatalf("third session from one address: %v %v, want 429 with Retry-After", res, err)
	} else {
		res.Body.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	if _, res, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(hs.URL, "http")+"/?EIO=4&transport=websocket", nil); err == nil || res == nil || res.StatusCode != 429 {
		t.Fatalf("websocket past the budget: %v %v", res, err)
	}
	if got(LimitSessionsPerAddr) != 2 {
		t.Fatalf("rejections = %d, want 2", got(LimitSessionsPerAddr))
	}
	post(t, hs.URL+"/?EIO=4&transport=polling&sid="+sid1, "1")
	handshake(t, hs.URL) // the closed session's slot is free again

	_, hs2 := start(t, Config{MaxSessions: 1, OnReject: count}, newEcho())
	handshake(t, hs2.URL)
	if status, _ := get(t, hs2.URL+"/?EIO=4&transport=polling"); status != http.StatusServiceUnavailable {
		t.Fatalf("session past the total: %d, want 503", status)
	}
	if got(LimitSessions) != 1 {
		t.Fatalf("total rejections = %d", got(LimitSessions))
	}
}

// TestSessionsDoNotKeepRequests opens 2000 polling sessions whose handshakes
// carry 128 KiB of headers each (256 MiB in all): the sessions must not keep
// them.
func TestSessionsDoNotKeepRequests(t *testing.T) {
	srv := NewServer(Config{MaxSessionsPerAddr: 1 << 20}, newEcho())
	defer srv.Shutdown(context.Background())
	big := strings.Repeat("x", 128<<10)
	const n = 2000
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	for range n {
		r := httptest.NewRequest(http.MethodGet, "/?EIO=4&transport=polling", nil)
		r.Header.Set("X-Padding", big)
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, r)
		if rec.Code != 200 {
			t.Fatalf("handshake %d", rec.Code)
		}
	}
	after := heap()
	if srv.NumSessions() != n {
		t.Fatalf("%d sessions", srv.NumSessions())
	}
	per := (float64(after) - float64(before)) / n
	t.Logf("%.0f bytes per polling session (handshake headers: %d bytes)", per, len(big))
	if per > 4096 {
		t.Fatalf("%.0f bytes per polling session: the session keeps its request", per)
	}
}

// TestPingJumpsTheQueue: a ping due while messages wait is sent before them.
func TestPingJumpsTheQueue(t *testing.T) {
	t.Parallel()
	srv, hs := start(t, Config{PingInterval: 50 * time.Millisecond, PingTimeout: 5 * time.Second}, newEcho())
	sid := handshake(t, hs.URL)
	c := srv.Lookup(sid)
	for i := range 100 {
		if err := c.Send(NewTextMessage(strings.Repeat("y", i))); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(ioTimeout)
	for !c.q.ping.Load() {
		if time.Now().After(deadline) {
			t.Fatal("no ping became due")
		}
		time.Sleep(5 * time.Millisecond)
	}
	_, body := get(t, hs.URL+"/?EIO=4&transport=polling&sid="+sid)
	pkts := strings.Split(body, "\x1e")
	if pkts[0] != "2" || len(pkts) != 101 {
		t.Fatalf("first packet %q of %d, want the ping before the 100 queued messages", pkts[0], len(pkts))
	}
}

// TestHintsNeverCloseASlowSession: a session that does not read gets at most
// MaxHints hints queued, identical hints are coalesced, and it is never
// closed for them; ordinary messages still fit.
func TestHintsNeverCloseASlowSession(t *testing.T) {
	t.Parallel()
	srv, hs := start(t, Config{SendQueue: 64, MaxHints: 8}, newEcho())
	sid := handshake(t, hs.URL)
	c := srv.Lookup(sid)
	same := NewTextMessage("same")
	if !c.SendHint(same) || c.SendHint(NewTextMessage("same")) {
		t.Fatal("an identical hint was not coalesced")
	}
	queued := 1
	for i := range 10_000 {
		if c.SendHint(NewTextMessage("hint " + strings.Repeat("z", i%7))) {
			queued++
		}
	}
	if queued != 8 {
		t.Fatalf("%d hints queued, want 8", queued)
	}
	if c.Closed() {
		t.Fatal("hints closed the session")
	}
	if err := c.Send(NewTextMessage("real")); err != nil {
		t.Fatalf("ordinary message after hints: %v", err)
	}
	_, body := get(t, hs.URL+"/?EIO=4&transport=polling&sid="+sid)
	if pkts := strings.Split(body, "\x1e"); len(pkts) != 9 || pkts[8] != "4real" {
		t.Fatalf("GET = %q", body)
	}
	// Queue half full: hints are dropped, messages are not.
	for range 40 {
		_ = c.Send(NewTextMessage("m"))
	}
	if c.SendHint(NewTextMessage("late")) {
		t.Fatal("hint queued into a half-full queue")
	}
}
