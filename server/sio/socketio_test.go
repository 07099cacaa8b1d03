package sio

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/zndraw/joblib/server/sio/engineio"
)

// Socket.IO cases, re-expressed from the socket.io-protocol compliance suite,
// plus the server API.

func TestConnect(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	w, open := openWS(t, ts)
	w.send("40")
	id := socketIDFrom(t, w.next())
	if id == open["sid"] {
		t.Fatal("socket id equals the engine session id")
	}
	eventually(t, ioTimeout, "NumSockets 1", func() bool { return ts.srv.NumSockets() == 1 })
	if ts.srv.RoomSize(id) != 1 {
		t.Fatal("socket is not in its own room")
	}
}

func TestConnectWithAuth(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	w, _ := openWS(t, ts)
	w.send(`40{"token":"123"}`)
	socketIDFrom(t, w.next())
	if got := w.next(); got != `42["auth",{"token":"123"}]` {
		t.Fatalf("got %q", got)
	}
}

func TestConnectRefused(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	w, _ := openWS(t, ts)
	w.send(`40{"token":"bad"}`)
	if got := w.next(); got != `44{"data":{"reason":"bad token"},"message":"not authorized"}` {
		t.Fatalf("got %q", got)
	}
	// The session stays open and may try again.
	w.send(`40{"token":"good"}`)
	socketIDFrom(t, w.next())
	// No OnDisconnect for the refused attempt.
	select {
	case rec := <-ts.h.disconnCh:
		t.Fatalf("unexpected OnDisconnect %+v", rec)
	default:
	}
}

func TestConnectUnknownNamespace(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	w, _ := openWS(t, ts)
	w.send("40/random,")
	if got := w.next(); got != `44/random,{"message":"Invalid namespace"}` {
		t.Fatalf("got %q", got)
	}
	w.send("40")
	socketIDFrom(t, w.next())
}

func TestConnectTimeout(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	w, _ := openWS(t, ts)
	start := time.Now()
	if code := w.closed(5 * time.Second); code != CloseCodeConnectTimeout {
		t.Fatalf("close code %d, want %d", code, CloseCodeConnectTimeout)
	}
	if d := time.Since(start); d < 800*time.Millisecond {
		t.Fatalf("closed after %v, before ConnectTimeout", d)
	}
	pc, _ := pollOpen(t, ts)
	start = time.Now()
	for {
		status, body := pc.get()
		if status == 400 || strings.HasSuffix(body, "1") {
			break
		}
		// A pong can reach a session the connect timeout has just closed:
		// that is the close this test waits for.
		if body == "2" {
			if status, _ := pc.post("3"); status == 400 {
				break
			}
		}
	}
	if d := time.Since(start); d < 800*time.Millisecond {
		t.Fatalf("polling session closed after %v, before ConnectTimeout", d)
	}
	if status, body := pc.get(); status != 400 {
		t.Fatalf("GET after the connect timeout = %d %q, want 400", status, body)
	}
}

func TestClientNamespaceDisconnect(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	w, id := connectWS(t, ts)
	w.send("41")
	rec := ts.h.waitDisconnect(t, ioTimeout)
	if rec.id != id || rec.reason != ReasonClientNamespaceDisconnect {
		t.Fatalf("OnDisconnect %+v", rec)
	}
	// The session stays open: the next thing is a ping.
	if _, data := w.read(); string(data) != "2" {
		t.Fatalf("got %q, want ping", data)
	}
	w.send("3")
	if ts.srv.RoomSize(id) != 0 || ts.srv.NumSockets() != 0 {
		t.Fatal("socket still registered")
	}
	// Joining again gives a new socket.
	w.send("40")
	if id2 := socketIDFrom(t, w.next()); id2 == id {
		t.Fatal("socket id reused")
	}
}

func TestServerDisconnect(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	w, id := connectWS(t, ts)
	w.send(`42["disconnect-me"]`)
	if got := w.next(); got != "41" {
		t.Fatalf("got %q, want DISCONNECT", got)
	}
	rec := ts.h.waitDisconnect(t, ioTimeout)
	if rec.id != id || rec.reason != ReasonServerNamespaceDisconnect {
		t.Fatalf("OnDisconnect %+v", rec)
	}
	// The client closes the engine session (as socket.io-client does); no second OnDisconnect.
	_ = w.c.Close(websocket.StatusNormalClosure, "")
	select {
	case rec := <-ts.h.disconnCh:
		t.Fatalf("second OnDisconnect %+v", rec)
	case <-time.After(100 * time.Millisecond):
	}
}

func TestServerDisconnectClosesIdleSession(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	w, _ := connectWS(t, ts)
	w.send(`42["disconnect-me"]`)
	if got := w.next(); got != "41" {
		t.Fatalf("got %q", got)
	}
	// A client that keeps the session open is closed by the server after PingTimeout.
	if code := w.closed(3 * time.Second); code != CloseCodeConnectTimeout {
		t.Fatalf("close code %d", code)
	}
}

func TestEvents(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	w, _ := connectWS(t, ts)

	w.send(`42["message",1,"2",{"3":[true]}]`)
	if got := w.next(); got != `42["message-back",1,"2",{"3":[true]}]` {
		t.Fatalf("plain event: %q", got)
	}
	w.send(`420["message-with-ack",1,"2",{"3":[true]}]`)
	if got := w.next(); got != `430[1,"2",{"3":[true]}]` {
		t.Fatalf("ack: %q", got)
	}
	w.send(`4213["message-with-ack"]`)
	if got := w.next(); got != `4313[]` {
		t.Fatalf("empty ack: %q", got)
	}

	// Binary event, echoed as a binary event.
	w.send(`451-["message",{"_placeholder":true,"num":0}]`)
	w.sendBinary([]byte{1, 2, 3})
	if got := w.next(); got != `451-["message-back",{"_placeholder":true,"num":0}]` {
		t.Fatalf("binary event: %q", got)
	}
	if b := w.nextBinary(); !reflect.DeepEqual(b, []byte{1, 2, 3}) {
		t.Fatalf("attachment %v", b)
	}

	// Binary event with ack id 0, answered with a binary ack with two attachments.
	w.send(`452-0["message-with-ack",{"_placeholder":true,"num":0},{"x":{"_placeholder":true,"num":1}}]`)
	w.sendBinary([]byte{4})
	w.sendBinary([]byte{5, 6})
	if got := w.next(); got != `462-0[{"_placeholder":true,"num":0},{"x":{"_placeholder":true,"num":1}}]` {
		t.Fatalf("binary ack: %q", got)
	}
	if b := w.nextBinary(); !reflect.DeepEqual(b, []byte{4}) {
		t.Fatalf("attachment 0 = %v", b)
	}
	if b := w.nextBinary(); !reflect.DeepEqual(b, []byte{5, 6}) {
		t.Fatalf("attachment 1 = %v", b)
	}
}

func TestServerToClientAck(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	w, _ := connectWS(t, ts)
	for i, tc := range []struct {
		reply func(id string)
		want  string
	}{
		{func(id string) { w.send(`43` + id + `[{"answer":42}]`) }, `42["answer",{"answer":42}]`},
		{func(id string) { w.send(`461-` + id + `[{"_placeholder":true,"num":0}]`); w.sendBinary([]byte{1, 2}) }, `42["answer","AQI="]`},
		{func(id string) { w.send(`43` + id + `[]`) }, `42["answer",null]`},
	} {
		w.send(`42["ask",{"n":21}]`)
		q := w.next()
		wantPrefix := `42` + itoa(i) + `["question",{"n":21}]`
		if q != wantPrefix {
			t.Fatalf("question %d = %q, want %q", i, q, wantPrefix)
		}
		tc.reply(itoa(i))
		if got := w.next(); got != tc.want {
			t.Fatalf("answer %d = %q, want %q", i, got, tc.want)
		}
	}
}

func TestEmitWithAckTimeoutAndClose(t *testing.T) {
	t.Parallel()
	h := newTestHandler()
	sockets := make(chan *Socket, 1)
	h.onConnect = func(s *Socket) error { sockets <- s; return nil }
	ts := startServer(t, testConfig(), h)
	w, _ := connectWS(t, ts)
	sock := <-sockets
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := sock.EmitWithAck(ctx, "question", 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want deadline", err)
	}
	if got := w.next(); got != `420["question",1]` {
		t.Fatalf("got %q", got)
	}
	done := make(chan error, 1)
	go func() {
		_, err := sock.EmitWithAck(context.Background(), "question", 2)
		done <- err
	}()
	if got := w.next(); got != `421["question",2]` {
		t.Fatalf("got %q", got)
	}
	_ = w.c.CloseNow()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("err %v, want ErrClosed", err)
		}
	case <-time.After(ioTimeout):
		t.Fatal("EmitWithAck did not return after the socket closed")
	}
	if err := sock.Emit("x"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Emit after close: %v", err)
	}
}

func TestReservedEventNames(t *testing.T) {
	t.Parallel()
	h := newTestHandler()
	sockets := make(chan *Socket, 1)
	h.onConnect = func(s *Socket) error { sockets <- s; return nil }
	ts := startServer(t, testConfig(), h)
	w, _ := connectWS(t, ts)
	sock := <-sockets
	for _, name := range []string{"connect", "connect_error", "disconnect", "disconnecting", "newListener", "removeListener"} {
		if err := sock.Emit(name, 1); !errors.Is(err, ErrReservedEvent) {
			t.Errorf("Emit(%q) = %v", name, err)
		}
		if err := ts.srv.EmitTo(sock.ID(), name); !errors.Is(err, ErrReservedEvent) {
			t.Errorf("EmitTo(%q) = %v", name, err)
		}
	}
	if err := sock.Emit("fine", []byte{9}); err != nil {
		t.Fatal(err)
	}
	if got := w.next(); got != `451-["fine",{"_placeholder":true,"num":0}]` {
		t.Fatalf("got %q", got)
	}
	w.nextBinary()
}

func TestInvalidPacketsClose(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	healthy, _ := connectWS(t, ts)
	cases := []struct {
		name    string
		connect bool
		send    func(w *wsClient)
	}{
		{"unknown socket.io type", true, func(w *wsClient) { w.send("4abc") }},
		{"event payload not an array", true, func(w *wsClient) { w.send(`42{"abc":1}`) }},
		{"invalid ack id", true, func(w *wsClient) { w.send(`42abc["message"]`) }},
		{"reserved event name", true, func(w *wsClient) { w.send(`42["disconnect"]`) }},
		{"unknown engine.io type", true, func(w *wsClient) { w.send("9") }},
		{"empty frame", true, func(w *wsClient) { w.send("") }},
		{"ping from client", true, func(w *wsClient) { w.send("2") }},
		{"open from client", true, func(w *wsClient) { w.send("0") }},
		{"DISCONNECT with payload", true, func(w *wsClient) { w.send(`41{}`) }},
		{"event before CONNECT", false, func(w *wsClient) { w.send(`42["message"]`) }},
		{"DISCONNECT before CONNECT", false, func(w *wsClient) { w.send(`41`) }},
		{"event for an unjoined namespace", true, func(w *wsClient) { w.send(`42/admin,["message"]`) }},
		{"second CONNECT", true, func(w *wsClient) { w.send(`40`) }},
		{"CONNECT_ERROR from client", true, func(w *wsClient) { w.send(`44{"message":"x"}`) }},
		{"binary frame without header", true, func(w *wsClient) { w.sendBinary([]byte{1}) }},
		{"text while waiting for attachments", true, func(w *wsClient) {
			w.send(`451-["message",{"_placeholder":true,"num":0}]`)
			w.send(`42["message"]`)
		}},
		{"placeholder out of range", true, func(w *wsClient) {
			w.send(`451-["message",{"_placeholder":true,"num":1}]`)
			w.sendBinary([]byte{1})
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var w *wsClient
			if tc.connect {
				w, _ = connectWS(t, ts)
			} else {
				w, _ = openWS(t, ts)
			}
			tc.send(w)
			if code := w.closed(ioTimeout); code != CloseCodeParseError {
				t.Fatalf("close code %d, want %d", code, CloseCodeParseError)
			}
		})
	}
	// Over polling the offending POST gets 400 and the session ends.
	pc, _ := pollOpen(t, ts)
	pc.connect()
	if status, _ := pc.post(`42{"abc":1}`); status != 400 {
		t.Fatalf("invalid POST = %d", status)
	}
	if status, body := pc.get(); status != 400 && body != "1" {
		t.Fatalf("GET after invalid POST = %d %q", status, body)
	}
	// Nobody else noticed.
	healthy.send(`420["echo","ok"]`)
	if got := healthy.next(); got != `430["ok"]` {
		t.Fatalf("healthy connection got %q", got)
	}
}

func TestSlowHandlerDoesNotDelayPongs(t *testing.T) {
	t.Parallel()
	h := newTestHandler()
	var (
		mu    sync.Mutex
		order []int
	)
	release := make(chan struct{})
	h.onEvent = func(ctx context.Context, s *Socket, ev Event, ack AckFunc) bool {
		if ev.Name != "slow" {
			return false
		}
		var n int
		_ = json.Unmarshal(ev.Args[0], &n)
		if n == 0 {
			<-release // longer than pingInterval + pingTimeout
		}
		// Sequential per socket, but read by the test goroutine after the
		// acks, which reach it through a socket the race detector cannot
		// see as an ordering: hence the lock.
		mu.Lock()
		order = append(order, n)
		mu.Unlock()
		if ack != nil {
			_ = ack(n)
		}
		return true
	}
	ts := startServer(t, testConfig(), h)
	w, _ := connectWS(t, ts)
	for i := range 5 {
		w.send(`42` + itoa(i) + `["slow",` + itoa(i) + `]`)
	}
	time.AfterFunc(1200*time.Millisecond, func() { close(release) })
	for i := range 5 {
		if got, want := w.next(), `43`+itoa(i)+`[`+itoa(i)+`]`; got != want {
			t.Fatalf("ack %d = %q, want %q", i, got, want)
		}
	}
	mu.Lock()
	got := slices.Clone(order)
	mu.Unlock()
	if !reflect.DeepEqual(got, []int{0, 1, 2, 3, 4}) {
		t.Fatalf("handler order %v", got)
	}
	select {
	case rec := <-ts.h.disconnCh:
		t.Fatalf("disconnected while the handler was slow: %+v", rec)
	default:
	}
}

func TestRoomsAndSocketAPI(t *testing.T) {
	t.Parallel()
	h := newTestHandler()
	sockets := make(chan *Socket, 4)
	h.onConnect = func(s *Socket) error {
		s.Join("early") // joined during OnConnect: delivered after the CONNECT reply
		_ = s.Emit("welcome", s.ID())
		sockets <- s
		return nil
	}
	ts := startServer(t, testConfig(), h)
	w1, id1 := connectWS(t, ts)
	if got := w1.next(); got != `42["welcome","`+id1+`"]` {
		t.Fatalf("got %q", got)
	}
	s1 := <-sockets
	pc, _ := pollOpen(t, ts)
	pc.mustPost("40")
	pkts := pc.next()
	id2 := socketIDFrom(t, pkts[0])
	if len(pkts) == 1 {
		pkts = append(pkts, pc.next()...)
	}
	if pkts[1] != `42["welcome","`+id2+`"]` {
		t.Fatalf("got %q", pkts)
	}
	s2 := <-sockets

	if s1.Transport() != engineio.WebSocket || s2.Transport() != engineio.Polling {
		t.Fatalf("transports %q %q", s1.Transport(), s2.Transport())
	}
	s1.SetData("worker-1")
	if s1.Data() != "worker-1" {
		t.Fatal("Data")
	}
	s1.Join("r")
	s2.Join("r")
	s2.Join("r") // idempotent
	if got := s1.Rooms(); !reflect.DeepEqual(got, sorted(id1, "early", "r")) {
		t.Fatalf("rooms %v", got)
	}
	if ts.srv.RoomSize("r") != 2 || ts.srv.RoomSize("early") != 2 {
		t.Fatalf("room sizes %d %d", ts.srv.RoomSize("r"), ts.srv.RoomSize("early"))
	}
	if err := ts.srv.EmitTo("r", "news", map[string]any{"n": 1}, []byte{7}); err != nil {
		t.Fatal(err)
	}
	if got := w1.next(); got != `451-["news",{"n":1},{"_placeholder":true,"num":0}]` {
		t.Fatalf("ws got %q", got)
	}
	w1.nextBinary()
	if got := pc.next(); !reflect.DeepEqual(got, []string{`451-["news",{"n":1},{"_placeholder":true,"num":0}]`, "bBw=="}) {
		t.Fatalf("polling got %q", got)
	}
	s2.Leave("r")
	if ts.srv.RoomSize("r") != 1 {
		t.Fatal("Leave")
	}
	_ = ts.srv.EmitTo("nobody", "x")
	if ts.srv.NumSockets() != 2 {
		t.Fatalf("NumSockets %d", ts.srv.NumSockets())
	}
	s1.Close("kicked")
	if rec := ts.h.waitDisconnect(t, ioTimeout); rec.reason != "kicked" {
		t.Fatalf("reason %q", rec.reason)
	}
	if code := w1.closed(ioTimeout); code != CloseCodeGeneric {
		t.Fatalf("close code %d", code)
	}
	if s1.Context().Err() == nil {
		t.Fatal("context not cancelled")
	}
	if ts.srv.RoomSize("r") != 0 || ts.srv.RoomSize(id1) != 0 || len(s1.Rooms()) != 0 {
		t.Fatal("closed socket still in rooms")
	}
	s1.Join("late") // no-op on a gone socket
	if ts.srv.RoomSize("late") != 0 {
		t.Fatal("gone socket joined a room")
	}
}

func sorted(s ...string) []string { sort.Strings(s); return s }

func TestShutdown(t *testing.T) {
	t.Parallel()
	h := newTestHandler()
	var inHandler atomic.Bool
	h.onEvent = func(ctx context.Context, s *Socket, ev Event, ack AckFunc) bool {
		if ev.Name != "block" {
			return false
		}
		inHandler.Store(true)
		<-ctx.Done() // the socket context ends on shutdown
		time.Sleep(50 * time.Millisecond)
		inHandler.Store(false)
		return true
	}
	srv := New(testConfig(), h)
	h.srv = srv
	ts := &testServer{srv: srv, h: h}
	hs := newHTTPServer(t, srv)
	ts.url = hs.URL

	ws1, _ := connectWS(t, ts)
	ws2 := upgradedClient(t, ts)
	pc, _ := pollOpen(t, ts)
	pc.connect()
	ws1.send(`42["block"]`)
	eventually(t, ioTimeout, "handler running", inHandler.Load)
	pending := make(chan string, 1)
	go func() {
		_, body, _ := httpDo(t, "GET", pc.url(), "")
		pending <- body
	}()
	s := ts.session(pc.sid)
	eventually(t, ioTimeout, "pending GET", s.PollWaiting)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if inHandler.Load() {
		t.Fatal("Shutdown returned while a handler was running")
	}
	if n := srv.goroutines(); n != 0 {
		t.Fatalf("%d goroutines after Shutdown", n)
	}
	if body := <-pending; body != "1" {
		t.Fatalf("pending GET got %q", body)
	}
	for _, w := range []*wsClient{ws1, ws2} {
		if code := w.closed(ioTimeout); code != websocket.StatusGoingAway && code != -1 {
			t.Fatalf("close code %d", code)
		}
	}
	h.mu.Lock()
	reasons := map[string]int{}
	for _, d := range h.disconnects {
		reasons[d.reason]++
	}
	h.mu.Unlock()
	if !reflect.DeepEqual(reasons, map[string]int{ReasonServerShutdown: 3}) {
		t.Fatalf("disconnect reasons %v", reasons)
	}
	if status, _, _ := httpDo(t, "GET", ts.endpoint("EIO=4&transport=polling"), ""); status != 503 {
		t.Fatalf("handshake after Shutdown = %d", status)
	}
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("second Shutdown: %v", err)
	}
}

// upgradedClient connects over polling and upgrades to websocket.
func upgradedClient(t *testing.T, ts *testServer) *wsClient {
	t.Helper()
	pc, _ := pollOpen(t, ts)
	pc.connect()
	return upgradeToWebSocket(t, ts, pc)
}
