package sio

import (
	"bytes"
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// Socket.IO budgets: each attack is refused (an error ack when the client
// asked for one, else a close with the budget's reason), what it costs the
// server stays bounded, and a bystander connection carries on.

// rejections counts Config.OnReject calls by budget.
type rejections struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *rejections) inc(limit string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[limit]++
}

func (r *rejections) get(limit string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[limit]
}

func budgetConfig(rej *rejections) Config {
	cfg := testConfig()
	cfg.MaxAttachments = 4
	cfg.MaxEventBytes = 64 << 10
	cfg.MaxDepth = 16
	cfg.MaxRooms = 5
	cfg.OnReject = rej.inc
	cfg.RejectAck = func(limit string) []any { return []any{map[string]string{"error": limit}} }
	return cfg
}

// bystanderRTT checks that an unrelated connection still answers, and logs
// its round trip.
func bystanderRTT(t *testing.T, w *wsClient) {
	t.Helper()
	start := time.Now()
	w.send(`4299["echo","still here"]`)
	if got := w.next(); got != `4399["still here"]` {
		t.Fatalf("bystander got %q", got)
	}
	t.Logf("bystander echo round trip: %v", time.Since(start))
}

func nested(depth int) string {
	return strings.Repeat("[", depth) + strings.Repeat("]", depth)
}

func TestBudgetAttachments(t *testing.T) {
	t.Parallel()
	var rej rejections
	ts := startServer(t, budgetConfig(&rej), nil)
	bystander, _ := connectWS(t, ts)

	w, _ := connectWS(t, ts)
	// Within the budget: echoed.
	w.send(`452-1["echo",{"_placeholder":true,"num":0},{"_placeholder":true,"num":1}]`)
	w.sendBinary([]byte{1})
	w.sendBinary([]byte{2})
	if got := w.next(); got != `462-1[{"_placeholder":true,"num":0},{"_placeholder":true,"num":1}]` {
		t.Fatalf("binary echo = %q", got)
	}
	w.nextBinary()
	w.nextBinary()
	// Ten attachments announced, four allowed: the ten are read and dropped,
	// the ack carries the refusal, the connection stays.
	w.send(`4510-7["echo",{"_placeholder":true,"num":0}]`)
	for range 10 {
		w.sendBinary(bytes.Repeat([]byte{9}, 1024))
	}
	if got := w.next(); got != `437[{"error":"socket_attachments"}]` {
		t.Fatalf("refusal = %q", got)
	}
	w.send(`428["echo","after"]`)
	if got := w.next(); got != `438["after"]` {
		t.Fatalf("after refusal: %q", got)
	}
	// Without an ack id the session is closed with the budget's reason.
	w.send(`4510-["echo",{"_placeholder":true,"num":0}]`)
	for range 10 {
		w.sendBinary([]byte{9})
	}
	if code := w.closed(ioTimeout); code != CloseCodeLimit {
		t.Fatalf("close code %d, want %d", code, CloseCodeLimit)
	}
	if n := rej.get(LimitAttachments); n != 2 {
		t.Fatalf("%d attachment rejections, want 2", n)
	}
	bystanderRTT(t, bystander)
}

// TestBudgetEventBytes: attachments are counted as they arrive; past
// MaxEventBytes they are dropped at once, so a packet that announces many
// large attachments and never completes holds at most the budget.
func TestBudgetEventBytes(t *testing.T) {
	t.Parallel()
	var rej rejections
	cfg := budgetConfig(&rej)
	cfg.MaxAttachments = 64
	cfg.MaxEventBytes = 2 << 20
	// The test sends 36 MB without reading, which takes over 10 s under -race
	// on a loaded machine: no ping may fall due meanwhile.
	cfg.PingInterval = 2 * time.Minute
	ts := startServer(t, cfg, nil)
	bystander, _ := connectWS(t, ts)
	w, _ := connectWS(t, ts)

	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	// 64 attachments of 900 kB announced, 40 sent (36 MB): never completed.
	w.send(`4564-3["echo",{"_placeholder":true,"num":0}]`)
	chunk := bytes.Repeat([]byte{7}, 900_000)
	for range 40 {
		w.sendBinary(chunk)
	}
	bystanderRTT(t, bystander) // the attack's frames have been read by now
	grown := int64(heap()) - int64(before)
	t.Logf("heap growth with 36 MB of attachments pending: %d kB", grown>>10)
	if grown > 12<<20 {
		t.Fatalf("heap grew by %d MB: attachments past the budget were kept", grown>>20)
	}
	// The rest arrives: one refusal, by ack.
	for range 24 {
		w.sendBinary([]byte{1})
	}
	if got := w.next(); got != `433[{"error":"socket_event_bytes"}]` {
		t.Fatalf("refusal = %q", got)
	}
	if n := rej.get(LimitEventBytes); n != 1 {
		t.Fatalf("%d rejections", n)
	}
}

func TestBudgetDepth(t *testing.T) {
	t.Parallel()
	var rej rejections
	ts := startServer(t, budgetConfig(&rej), nil)
	bystander, _ := connectWS(t, ts)
	w, _ := connectWS(t, ts)

	w.send(`421["echo",` + nested(15) + `]`)
	if got := w.next(); got != `431[`+nested(15)+`]` {
		t.Fatalf("within the budget: %q", got)
	}
	w.send(`422["echo",` + nested(16) + `]`)
	if got := w.next(); got != `432[{"error":"socket_json_depth"}]` {
		t.Fatalf("past the budget: %q", got)
	}
	// Brackets inside strings do not count.
	w.send(`423["echo","` + strings.Repeat("[", 100) + `"]`)
	if got := w.next(); got != `433["`+strings.Repeat("[", 100)+`"]` {
		t.Fatalf("brackets in a string: %q", got)
	}
	// A binary packet too deep: its attachments are dropped, the ack refuses.
	w.send(`451-4["echo",{"_placeholder":true,"num":0},` + nested(20) + `]`)
	w.sendBinary([]byte{1})
	if got := w.next(); got != `434[{"error":"socket_json_depth"}]` {
		t.Fatalf("binary past the budget: %q", got)
	}
	// 90 kB nested 45,000 levels deep, without an ack: closed at once.
	start := time.Now()
	w.send(`42["echo",` + nested(45_000) + `]`)
	if code := w.closed(ioTimeout); code != CloseCodeLimit {
		t.Fatalf("close code %d, want %d", code, CloseCodeLimit)
	}
	t.Logf("deep event refused in %v", time.Since(start))
	if n := rej.get(LimitDepth); n != 3 {
		t.Fatalf("%d depth rejections, want 3", n)
	}
	bystanderRTT(t, bystander)
}

func TestBudgetRooms(t *testing.T) {
	t.Parallel()
	var rej rejections
	ts := startServer(t, budgetConfig(&rej), nil)
	w, _ := connectWS(t, ts)
	// The socket's own room counts: four more fit in five.
	for i := range 4 {
		w.send(`420["join","r` + itoa(i) + `"]`)
		if got := w.next(); got != `430["joined"]` {
			t.Fatalf("join %d: %q", i, got)
		}
	}
	for range 100 {
		w.send(`421["join","one too many"]`)
		if got := w.next(); got != `431["`+ErrTooManyRooms.Error()+`"]` {
			t.Fatalf("join past the budget: %q", got)
		}
	}
	w.send(`422["join","r0"]`) // already in: fine
	if got := w.next(); got != `432["joined"]` {
		t.Fatalf("rejoin: %q", got)
	}
	if n := rej.get(LimitRooms); n != 100 {
		t.Fatalf("%d room rejections", n)
	}
}

// TestBudgetConnectTimeoutWithRefusals: a session whose CONNECTs keep being
// refused is closed after ConnectTimeout like one that sends none.
func TestBudgetConnectTimeoutWithRefusals(t *testing.T) {
	t.Parallel()
	var rej rejections
	ts := startServer(t, budgetConfig(&rej), nil)
	w, _ := openWS(t, ts)
	deadline := time.Now().Add(10 * time.Second)
	refusals := 0
	for {
		if time.Now().After(deadline) {
			t.Fatalf("still open after %d refused CONNECTs", refusals)
		}
		ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
		err := w.c.Write(ctx, websocket.MessageText, []byte(`40{"token":"bad"}`))
		cancel()
		if err != nil {
			break
		}
		typ, data, err := w.readErr(ioTimeout)
		for err == nil && string(data) == "2" {
			w.send("3")
			typ, data, err = w.readErr(ioTimeout)
		}
		if err != nil {
			if code := websocket.CloseStatus(err); code != CloseCodeConnectTimeout {
				t.Fatalf("closed with %d (%v), want %d", code, err, CloseCodeConnectTimeout)
			}
			break
		}
		if typ != websocket.MessageText || !strings.HasPrefix(string(data), "44{") {
			t.Fatalf("got %q, want CONNECT_ERROR", data)
		}
		refusals++
	}
	if refusals < 2 {
		t.Fatalf("only %d refusals before the close", refusals)
	}
	if rej.get(LimitConnect) != 1 {
		t.Fatalf("connect timeouts counted: %d", rej.get(LimitConnect))
	}
}
