package sio

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/zndraw/joblib/server/sio/engineio"
)

// Engine.IO cases, re-expressed from the engine.io-protocol compliance suite.

func TestHandshakePolling(t *testing.T) {
	t.Parallel()
	ts := startServer(t, heartbeatConfig(), nil)
	_, open := pollOpen(t, ts)
	keys := make([]string, 0, len(open))
	for k := range open {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if want := []string{"maxPayload", "pingInterval", "pingTimeout", "sid", "upgrades"}; !reflect.DeepEqual(keys, want) {
		t.Fatalf("open keys = %v, want %v", keys, want)
	}
	if sid, _ := open["sid"].(string); len(sid) < 16 {
		t.Fatalf("sid %q too short", sid)
	}
	if !reflect.DeepEqual(open["upgrades"], []any{"websocket"}) {
		t.Fatalf("upgrades = %v, want [websocket]", open["upgrades"])
	}
	if open["pingInterval"] != 300.0 || open["pingTimeout"] != 200.0 || open["maxPayload"] != 1e6 {
		t.Fatalf("open = %v", open)
	}
}

func TestHandshakeWebSocket(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	_, open := openWS(t, ts)
	if !reflect.DeepEqual(open["upgrades"], []any{}) {
		t.Fatalf("upgrades = %#v, want []", open["upgrades"])
	}
	if len(open) != 5 {
		t.Fatalf("open = %v, want exactly 5 keys", open)
	}
}

func TestBadRequests(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	pc, _ := pollOpen(t, ts)
	cases := []struct {
		name   string
		method string
		query  string
		status int
		code   int
	}{
		{"missing EIO", http.MethodGet, "transport=polling", 400, codeUnsupportedVersion},
		{"EIO 3", http.MethodGet, "EIO=3&transport=polling", 400, codeUnsupportedVersion},
		{"EIO abc", http.MethodGet, "EIO=abc&transport=polling", 400, codeUnsupportedVersion},
		{"missing transport", http.MethodGet, "EIO=4", 400, codeTransportUnknown},
		{"unknown transport", http.MethodGet, "EIO=4&transport=abc", 400, codeTransportUnknown},
		{"POST handshake", http.MethodPost, "EIO=4&transport=polling", 400, codeBadHandshakeMethod},
		{"PUT handshake", http.MethodPut, "EIO=4&transport=polling", 400, codeBadHandshakeMethod},
		{"unknown sid GET", http.MethodGet, "EIO=4&transport=polling&sid=nope", 400, codeUnknownSID},
		{"unknown sid POST", http.MethodPost, "EIO=4&transport=polling&sid=nope", 400, codeUnknownSID},
		{"unknown sid websocket", http.MethodGet, "EIO=4&transport=websocket&sid=nope", 400, codeUnknownSID},
		{"PUT on a session", http.MethodPut, "EIO=4&transport=polling&sid=" + pc.sid, 400, codeBadRequest},
	}
	for _, tc := range cases {
		status, body, hdr := httpDo(t, tc.method, ts.endpoint(tc.query), "")
		if status != tc.status {
			t.Errorf("%s: status %d, want %d (%s)", tc.name, status, tc.status, body)
			continue
		}
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal([]byte(body), &e); err != nil || e.Code != tc.code || e.Message == "" {
			t.Errorf("%s: body %q (%v), want code %d", tc.name, body, err, tc.code)
		}
		if ct := hdr.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: Content-Type %q", tc.name, ct)
		}
	}
	// The session used above is still healthy.
	if sid := pc.connect(); sid == "" {
		t.Fatal("no socket id")
	}
}

func TestPollingPingPong(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	pc, _ := pollOpen(t, ts)
	for i := range 3 {
		status, body := pc.get()
		if status != 200 || body != "2" {
			t.Fatalf("GET %d = %d %q, want ping", i, status, body)
		}
		pc.mustPost("3")
	}
	pc.connect()
}

func TestPollingPingTimeout(t *testing.T) {
	t.Parallel()
	ts := startServer(t, heartbeatConfig(), nil)
	pc, _ := pollOpen(t, ts)
	if status, body := pc.get(); body != "2" {
		t.Fatalf("GET = %d %q, want ping", status, body)
	}
	// No pong: the pending GET is released with a close packet, then the session is gone.
	if status, body := pc.get(); status != 200 || body != "1" {
		t.Fatalf("GET after missed pong = %d %q, want close packet", status, body)
	}
	if status, _ := pc.get(); status != 400 {
		t.Fatalf("GET after ping timeout = %d, want 400", status)
	}
}

func TestPollingPingTimeoutReason(t *testing.T) {
	t.Parallel()
	ts := startServer(t, heartbeatConfig(), nil)
	pc, _ := pollOpen(t, ts)
	pc.connect()
	// Stop polling altogether: the ping is never seen, so it is never answered.
	rec := ts.h.waitDisconnect(t, 5*time.Second)
	if rec.reason != ReasonPingTimeout {
		t.Fatalf("reason %q, want %q", rec.reason, ReasonPingTimeout)
	}
	if status, _ := pc.get(); status != 400 {
		t.Fatalf("GET after ping timeout = %d, want 400", status)
	}
}

func TestWebSocketPingPong(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	w, _ := openWS(t, ts)
	w.send("40")
	socketIDFrom(t, w.next())
	start := time.Now()
	for i := range 3 {
		_, data := w.read()
		if string(data) != "2" {
			t.Fatalf("frame %d = %q, want ping", i, data)
		}
		w.send("3")
	}
	if d := time.Since(start); d < 600*time.Millisecond {
		t.Fatalf("3 pings within %v: interval not respected", d)
	}
}

func TestWebSocketPingTimeout(t *testing.T) {
	t.Parallel()
	ts := startServer(t, heartbeatConfig(), nil)
	w, _ := openWS(t, ts)
	w.send("40")
	socketIDFrom(t, w.next())
	if _, data := w.read(); string(data) != "2" {
		t.Fatalf("got %q, want ping", data)
	}
	_, _, err := w.readErr(3 * time.Second)
	if code := websocket.CloseStatus(err); code != CloseCodePingTimeout {
		t.Fatalf("read err %v (code %d), want close %d", err, code, CloseCodePingTimeout)
	}
	if rec := ts.h.waitDisconnect(t, ioTimeout); rec.reason != ReasonPingTimeout {
		t.Fatalf("reason %q", rec.reason)
	}
}

func TestPingsKeepComingDuringTraffic(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	w, _ := connectWS(t, ts)
	// Keep traffic flowing in both directions; pings must still arrive (the JS
	// client re-arms its timer only on pings).
	pings := 0
	start := time.Now()
	for pings < 3 {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("only %d pings in %v of traffic", pings, time.Since(start))
		}
		w.send(`42["message","x"]`)
		for {
			_, data := w.read()
			if string(data) == "2" {
				pings++
				w.send("3")
				continue
			}
			break
		}
	}
	if d := time.Since(start); d < 600*time.Millisecond {
		t.Fatalf("3 pings within %v: interval not respected", d)
	}
}

func TestPollingForcedClose(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	pc, _ := pollOpen(t, ts)
	pc.connect()
	s := ts.session(pc.sid)
	got := make(chan string, 1)
	go func() {
		_, body, _ := httpDo(t, http.MethodGet, pc.url(), "")
		got <- body
	}()
	eventually(t, ioTimeout, "pending GET", s.PollWaiting)
	pc.mustPost("1")
	if body := <-got; body != "6" {
		t.Fatalf("pending GET = %q, want noop", body)
	}
	if status, _ := pc.get(); status != 400 {
		t.Fatalf("GET after close = %d, want 400", status)
	}
	if rec := ts.h.waitDisconnect(t, ioTimeout); rec.reason != ReasonTransportClose {
		t.Fatalf("reason %q", rec.reason)
	}
}

func TestWebSocketForcedClose(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	w, _ := connectWS(t, ts)
	w.send("1")
	if code := w.closed(ioTimeout); code != websocket.StatusNormalClosure {
		t.Fatalf("close code %d", code)
	}
	if rec := ts.h.waitDisconnect(t, ioTimeout); rec.reason != ReasonTransportClose {
		t.Fatalf("reason %q", rec.reason)
	}
}

func TestWebSocketClientGoesAway(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	w, _ := connectWS(t, ts)
	_ = w.c.Close(websocket.StatusGoingAway, "bye")
	if rec := ts.h.waitDisconnect(t, ioTimeout); rec.reason != ReasonTransportClose {
		t.Fatalf("reason %q", rec.reason)
	}
	eventually(t, ioTimeout, "socket count 0", func() bool { return ts.srv.NumSockets() == 0 })
}

func TestPollingFraming(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	pc, _ := pollOpen(t, ts)
	pc.connect()
	// Several packets in one POST, including a binary event (base64) with ack.
	pc.mustPost("420[\"echo\",1]\x1e421[\"echo\",{\"a\":\"b\"}]\x1e451-2[\"echo\",{\"_placeholder\":true,\"num\":0}]\x1ebAQID/w==")
	var got []string
	for len(got) < 4 {
		got = append(got, pc.next()...)
	}
	want := []string{`430[1]`, `431[{"a":"b"}]`, `461-2[{"_placeholder":true,"num":0}]`, "bAQID/w=="}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestPollingOverlappingGET(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	pc, _ := pollOpen(t, ts)
	pc.connect()
	s := ts.session(pc.sid)
	got := make(chan string, 1)
	go func() {
		_, body, _ := httpDo(t, http.MethodGet, pc.url(), "")
		got <- body
	}()
	eventually(t, ioTimeout, "pending GET", s.PollWaiting)
	if status, _ := pc.get(); status != 400 {
		t.Fatalf("second GET = %d, want 400", status)
	}
	if body := <-got; body != "1" {
		t.Fatalf("first GET = %q, want close packet", body)
	}
	if rec := ts.h.waitDisconnect(t, ioTimeout); rec.reason != ReasonTransportError {
		t.Fatalf("reason %q", rec.reason)
	}
}

func TestPollingPayloadTooLarge(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.MaxPayload = 100
	ts := startServer(t, cfg, nil)
	pc, _ := pollOpen(t, ts)
	pc.connect()
	if status, _ := pc.post(`42["echo","` + strings.Repeat("x", 200) + `"]`); status != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d, want 413", status)
	}
	if rec := ts.h.waitDisconnect(t, ioTimeout); rec.reason != ReasonPayloadTooLarge {
		t.Fatalf("reason %q", rec.reason)
	}
}

func TestWebSocketMessageTooLarge(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.MaxPayload = 100
	ts := startServer(t, cfg, nil)
	other, _ := connectWS(t, ts)
	w, _ := connectWS(t, ts)
	w.send(`42["echo","` + strings.Repeat("x", 200) + `"]`)
	if code := w.closed(ioTimeout); code != websocket.StatusMessageTooBig {
		t.Fatalf("close code %d, want 1009", code)
	}
	if rec := ts.h.waitDisconnect(t, ioTimeout); rec.reason != ReasonPayloadTooLarge {
		t.Fatalf("reason %q", rec.reason)
	}
	other.send(`420["echo","fine"]`)
	if got := other.next(); got != `430["fine"]` {
		t.Fatalf("other connection got %q", got)
	}
}

func TestPollingRejectsBinaryContentType(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	pc, _ := pollOpen(t, ts)
	req, _ := http.NewRequest(http.MethodPost, pc.url(), strings.NewReader("40"))
	req.Header.Set("Content-Type", "application/octet-stream")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 400 {
		t.Fatalf("status %d, want 400", res.StatusCode)
	}
}

func TestCORS(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.OriginPatterns = []string{"app.example.com", "https://*.trusted.dev"}
	ts := startServer(t, cfg, nil)
	do := func(method, origin string) *http.Response {
		req, _ := http.NewRequest(method, ts.endpoint("EIO=4&transport=polling"), nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Headers", "content-type")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res
	}
	for _, origin := range []string{"http://app.example.com", "https://x.trusted.dev", ts.url} {
		res := do(http.MethodOptions, origin)
		if res.StatusCode != http.StatusNoContent || res.Header.Get("Access-Control-Allow-Origin") != origin ||
			res.Header.Get("Access-Control-Allow-Credentials") != "true" || !strings.Contains(res.Header.Get("Access-Control-Allow-Methods"), "POST") ||
			res.Header.Get("Access-Control-Allow-Headers") != "content-type" {
			t.Errorf("preflight from %s: %d %v", origin, res.StatusCode, res.Header)
		}
		if res := do(http.MethodGet, origin); res.StatusCode != 200 || res.Header.Get("Access-Control-Allow-Origin") != origin {
			t.Errorf("handshake from %s: %d %v", origin, res.StatusCode, res.Header)
		}
	}
	for _, origin := range []string{"http://evil.example.com", "http://x.trusted.dev", "null"} {
		if res := do(http.MethodOptions, origin); res.StatusCode != http.StatusForbidden {
			t.Errorf("preflight from %s: %d, want 403", origin, res.StatusCode)
		}
		if res := do(http.MethodGet, origin); res.StatusCode != http.StatusForbidden {
			t.Errorf("handshake from %s: %d, want 403", origin, res.StatusCode)
		}
	}
	// Websocket: same rule.
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	hdr := http.Header{"Origin": []string{"http://evil.example.com"}}
	if c, _, err := websocket.Dial(ctx, ts.wsEndpoint("EIO=4&transport=websocket"), &websocket.DialOptions{HTTPHeader: hdr}); err == nil {
		c.CloseNow()
		t.Fatal("websocket from a foreign origin was accepted")
	}
	hdr = http.Header{"Origin": []string{"http://app.example.com"}}
	c, _, err := websocket.Dial(ctx, ts.wsEndpoint("EIO=4&transport=websocket"), &websocket.DialOptions{HTTPHeader: hdr})
	if err != nil {
		t.Fatalf("websocket from an allowed origin: %v", err)
	}
	c.CloseNow()
}

// upgradeToWebSocket runs the upgrade of a connected polling client with a GET
// pending during the probe, and returns the websocket.
func upgradeToWebSocket(t *testing.T, ts *testServer, pc *pollClient) *wsClient {
	t.Helper()
	s := ts.session(pc.sid)
	pending := make(chan string, 1)
	go func() {
		_, body, _ := httpDo(t, http.MethodGet, pc.url(), "")
		pending <- body
	}()
	eventually(t, ioTimeout, "pending GET", s.PollWaiting)
	w := dialWS(t, ts, pc.sid)
	w.send("2probe")
	if _, data := w.read(); string(data) != "3probe" {
		t.Fatalf("probe reply %q", data)
	}
	// The pending GET is released with a noop (a ping may come first).
	for body := <-pending; body != "6"; {
		if body != "2" {
			t.Fatalf("pending GET during upgrade = %q, want noop", body)
		}
		pc.mustPost("3")
		_, body = pc.get()
	}
	w.send("5")
	return w
}

func TestUpgrade(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	pc, _ := pollOpen(t, ts)
	pc.connect()
	w := upgradeToWebSocket(t, ts, pc)
	w.send(`420["echo","over websocket"]`)
	if got := w.next(); got != `430["over websocket"]` {
		t.Fatalf("got %q", got)
	}
	// Polling is over for this session.
	if status, _ := pc.get(); status != 400 {
		t.Fatalf("GET after upgrade = %d, want 400", status)
	}
	if status, _ := pc.post(`42["echo"]`); status != 400 {
		t.Fatalf("POST after upgrade = %d, want 400", status)
	}
	// A second websocket for the same session is accepted and closed at once
	// without a status, as the reference server does.
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	c, _, err := websocket.Dial(ctx, ts.wsEndpoint("EIO=4&transport=websocket&sid="+pc.sid), nil)
	if err != nil {
		t.Fatalf("second websocket: %v", err)
	}
	_, _, err = c.Read(ctx)
	if code := websocket.CloseStatus(err); code != websocket.StatusNoStatusRcvd {
		t.Fatalf("second websocket read: %v (code %d), want a close without status", err, code)
	}
	c.CloseNow()
	// The first one still works.
	w.send(`420["echo","still"]`)
	if got := w.next(); got != `430["still"]` {
		t.Fatalf("got %q", got)
	}
	if tr := transportOf(ts, pc.sid); tr != engineio.WebSocket {
		t.Fatalf("transport %q", tr)
	}
}

func transportOf(ts *testServer, sid string) string {
	s := ts.session(sid)
	return s.Transport()
}

func TestUpgradeMovesQueueInOrder(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	pc, _ := pollOpen(t, ts)
	id := pc.connect()
	s := ts.session(pc.sid)
	pending := make(chan string, 1)
	go func() {
		_, body, _ := httpDo(t, http.MethodGet, pc.url(), "")
		pending <- body
	}()
	eventually(t, ioTimeout, "pending GET", s.PollWaiting)
	w := dialWS(t, ts, pc.sid)
	w.send("2probe")
	if _, data := w.read(); string(data) != "3probe" {
		t.Fatalf("probe reply %q", data)
	}
	var early []string
	for body := <-pending; body != "6"; _, body = pc.get() {
		for _, p := range strings.Split(body, "\x1e") {
			if p == "2" {
				pc.mustPost("3")
			} else {
				early = append(early, p)
			}
		}
	}
	if len(early) > 0 {
		t.Fatalf("unexpected packets before the upgrade: %q", early)
	}
	// Packets queued between the probe and "5" must come out of the websocket, in order.
	const n = 50
	for i := range n {
		if err := ts.srv.EmitTo(id, "seq", i); err != nil {
			t.Fatal(err)
		}
	}
	w.send("5")
	for i := range n {
		if got, want := w.next(), `42["seq",`+itoa(i)+`]`; got != want {
			t.Fatalf("packet %d = %q, want %q", i, got, want)
		}
	}
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

func TestUpgradeTimeoutKeepsPolling(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.UpgradeTimeout = 200 * time.Millisecond
	ts := startServer(t, cfg, nil)
	pc, _ := pollOpen(t, ts)
	pc.connect()
	w := dialWS(t, ts, pc.sid)
	w.send("2probe")
	if _, data := w.read(); string(data) != "3probe" {
		t.Fatalf("probe reply %q", data)
	}
	// No "5": the probe websocket is closed, polling goes on.
	w.closed(ioTimeout)
	pc.mustPost(`420["echo","polling"]`)
	if got := pc.next(); !reflect.DeepEqual(got, []string{`430["polling"]`}) {
		t.Fatalf("got %q", got)
	}
	if tr := transportOf(ts, pc.sid); tr != engineio.Polling {
		t.Fatalf("transport %q", tr)
	}
}

// Engine.IO error codes of HTTP 400 bodies (engine.io's Server.errors).
const (
	codeTransportUnknown   = 0
	codeUnknownSID         = 1
	codeBadHandshakeMethod = 2
	codeBadRequest         = 3
	codeUnsupportedVersion = 5
)

// TestPollingRaces pins the answers to polling requests that race an
// upgrade: a GET in flight when "5" arrives is released with a noop whether
// it arrived before or after the probe; any GET or POST after "5" has been
// processed gets 400
// (the reference server's transport mismatch), and the websocket carries on.
// (A close POSTed while a GET is pending: see TestPollingForcedClose.)
func TestPollingRaces(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	for range 5 {
		pc, _ := pollOpen(t, ts)
		pc.connect()
		w := dialWS(t, ts, pc.sid)
		w.send("2probe")
		if _, data := w.read(); string(data) != "3probe" {
			t.Fatalf("probe reply %q", data)
		}
		inFlight := make(chan string, 1)
		go func() {
			_, body, _ := httpDo(t, http.MethodGet, pc.url(), "")
			inFlight <- body
		}()
		// The GET is pending (or already released by the upgrade's noop
		// timer) before "5" is sent.
		s := ts.session(pc.sid)
		eventually(t, ioTimeout, "GET pending or answered", func() bool { return s.PollWaiting() || len(inFlight) > 0 })
		w.send("5")
		for body := <-inFlight; body != "6"; _, body = pc.get() {
			if body != "2" { // a ping queued before the upgrade may come first
				t.Fatalf("GET racing the upgrade = %q, want noop", body)
			}
			pc.mustPost("3")
		}
		// A GET that reaches the server before "5" is processed gets a noop;
		// once "5" is processed every GET or POST gets 400.
		eventually(t, ioTimeout, "upgrade done", func() bool { return s.Transport() == engineio.WebSocket })
		if status, _ := pc.get(); status != 400 {
			t.Fatalf("GET right after 5 = %d, want 400", status)
		}
		if status, _ := pc.post("3"); status != 400 {
			t.Fatalf("POST right after 5 = %d, want 400", status)
		}
		w.send(`420["echo","ws"]`)
		if got := w.next(); got != `430["ws"]` {
			t.Fatalf("websocket after the upgrade: %q", got)
		}
	}
}
