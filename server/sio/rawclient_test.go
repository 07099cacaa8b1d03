package sio

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/zndraw/joblib/server/sio/engineio"
)

// Raw protocol clients for the compliance-style tests: net/http for polling and
// coder/websocket for websocket, speaking the wire format by hand.

const ioTimeout = 5 * time.Second

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if leaked := leakedGoroutines(5 * time.Second); leaked != "" {
			os.Stderr.WriteString("goroutines of package sio still running after all tests:\n" + leaked)
			code = 1
		}
	}
	os.Exit(code)
}

// leakedGoroutines waits up to d for every goroutine running code of this package
// (other than the caller) to exit, and returns the stacks of those that did not.
func leakedGoroutines(d time.Duration) string {
	deadline := time.Now().Add(d)
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var leaked []string
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "joblib/server/sio.") && !strings.Contains(g, "TestMain") && !strings.Contains(g, "leakedGoroutines") {
				leaked = append(leaked, g)
			}
		}
		if len(leaked) == 0 || time.Now().After(deadline) {
			return strings.Join(leaked, "\n\n")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// eventually polls cond until it holds or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (ts *testServer) endpoint(query string) string {
	return ts.url + "/socket.io/?" + query
}

func (ts *testServer) wsEndpoint(query string) string {
	return "ws" + strings.TrimPrefix(ts.url, "http") + "/socket.io/?" + query
}

// session looks up a live engine session (test-only access to internals).
func (ts *testServer) session(sid string) *engineio.Conn { return ts.srv.eio.Lookup(sid) }

// ---- polling ----

type pollClient struct {
	t   *testing.T
	ts  *testServer
	sid string
}

func httpDo(t *testing.T, method, url, body string) (int, string, http.Header) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "text/plain;charset=UTF-8")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("read body of %s %s: %v", method, url, err)
	}
	return res.StatusCode, string(b), res.Header
}

// pollOpen performs the polling handshake and returns the client and the open data.
func pollOpen(t *testing.T, ts *testServer) (*pollClient, map[string]any) {
	t.Helper()
	status, body, hdr := httpDo(t, http.MethodGet, ts.endpoint("EIO=4&transport=polling&t=abc"), "")
	if status != http.StatusOK || !strings.HasPrefix(body, "0") {
		t.Fatalf("handshake = %d %q", status, body)
	}
	if ct := hdr.Get("Content-Type"); ct != "text/plain; charset=UTF-8" {
		t.Fatalf("handshake Content-Type = %q", ct)
	}
	var open map[string]any
	if err := json.Unmarshal([]byte(body[1:]), &open); err != nil {
		t.Fatalf("open packet %q: %v", body, err)
	}
	sid, _ := open["sid"].(string)
	return &pollClient{t: t, ts: ts, sid: sid}, open
}

func (p *pollClient) url() string {
	return p.ts.endpoint("EIO=4&transport=polling&sid=" + p.sid)
}

func (p *pollClient) get() (int, string) {
	p.t.Helper()
	status, body, _ := httpDo(p.t, http.MethodGet, p.url(), "")
	return status, body
}

func (p *pollClient) post(body string) (int, string) {
	p.t.Helper()
	status, resp, _ := httpDo(p.t, http.MethodPost, p.url(), body)
	return status, resp
}

func (p *pollClient) mustPost(body string) {
	p.t.Helper()
	if status, resp := p.post(body); status != http.StatusOK || resp != "ok" {
		p.t.Fatalf("POST %q = %d %q", body, status, resp)
	}
}

// next returns the packets of the next GET that carries something other than
// pings, answering pings along the way.
func (p *pollClient) next() []string {
	p.t.Helper()
	for {
		status, body := p.get()
		if status != http.StatusOK {
			p.t.Fatalf("GET = %d %q", status, body)
		}
		var out []string
		for _, pkt := range strings.Split(body, "\x1e") {
			if pkt == "2" {
				p.mustPost("3")
				continue
			}
			out = append(out, pkt)
		}
		if len(out) > 0 {
			return out
		}
	}
}

// connect joins namespace "/" and returns the socket id.
func (p *pollClient) connect() string {
	p.t.Helper()
	p.mustPost("40")
	pkts := p.next()
	return socketIDFrom(p.t, pkts[0])
}

func socketIDFrom(t *testing.T, pkt string) string {
	t.Helper()
	if !strings.HasPrefix(pkt, "40{") {
		t.Fatalf("want CONNECT reply, got %q", pkt)
	}
	var reply struct {
		SID string `json:"sid"`
	}
	if err := json.Unmarshal([]byte(pkt[2:]), &reply); err != nil || reply.SID == "" {
		t.Fatalf("CONNECT reply %q: %v", pkt, err)
	}
	return reply.SID
}

// ---- websocket ----

type wsClient struct {
	t *testing.T
	c *websocket.Conn
}

func dialWS(t *testing.T, ts *testServer, sid string) *wsClient {
	t.Helper()
	q := "EIO=4&transport=websocket"
	if sid != "" {
		q += "&sid=" + sid
	}
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	c, _, err := websocket.Dial(ctx, ts.wsEndpoint(q), nil)
	if err != nil {
		t.Fatalf("dial websocket: %v", err)
	}
	c.SetReadLimit(-1)
	t.Cleanup(func() { _ = c.CloseNow() })
	return &wsClient{t: t, c: c}
}

// openWS dials a websocket-only session and checks the open packet.
func openWS(t *testing.T, ts *testServer) (*wsClient, map[string]any) {
	t.Helper()
	w := dialWS(t, ts, "")
	typ, data := w.read()
	if typ != websocket.MessageText || !strings.HasPrefix(string(data), "0{") {
		t.Fatalf("first frame = %v %q, want open packet", typ, data)
	}
	var open map[string]any
	if err := json.Unmarshal(data[1:], &open); err != nil {
		t.Fatal(err)
	}
	return w, open
}

// connectWS opens a websocket session and joins "/", returning the socket id.
func connectWS(t *testing.T, ts *testServer) (*wsClient, string) {
	t.Helper()
	w, _ := openWS(t, ts)
	w.send("40")
	return w, socketIDFrom(t, w.next())
}

func (w *wsClient) read() (websocket.MessageType, []byte) {
	w.t.Helper()
	typ, data, err := w.readErr(ioTimeout)
	if err != nil {
		w.t.Fatalf("websocket read: %v", err)
	}
	return typ, data
}

func (w *wsClient) readErr(timeout time.Duration) (websocket.MessageType, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return w.c.Read(ctx)
}

func (w *wsClient) send(text string) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	if err := w.c.Write(ctx, websocket.MessageText, []byte(text)); err != nil {
		w.t.Fatalf("websocket write %q: %v", text, err)
	}
}

func (w *wsClient) sendBinary(b []byte) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	if err := w.c.Write(ctx, websocket.MessageBinary, b); err != nil {
		w.t.Fatalf("websocket write binary: %v", err)
	}
}

// next returns the next text packet that is not a ping, answering pings.
func (w *wsClient) next() string {
	w.t.Helper()
	for {
		typ, data := w.read()
		if typ != websocket.MessageText {
			w.t.Fatalf("want text frame, got binary %v", data)
		}
		if string(data) == "2" {
			w.send("3")
			continue
		}
		return string(data)
	}
}

// nextBinary returns the next frame, which must be binary.
func (w *wsClient) nextBinary() []byte {
	w.t.Helper()
	typ, data := w.read()
	if typ != websocket.MessageBinary {
		w.t.Fatalf("want binary frame, got %q", data)
	}
	return data
}

// closed reads (answering pings) until the connection ends and returns the close
// status (-1 if the connection ended without a close frame).
func (w *wsClient) closed(timeout time.Duration) websocket.StatusCode {
	w.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		typ, data, err := w.readErr(time.Until(deadline))
		if err != nil {
			if time.Now().After(deadline) {
				w.t.Fatalf("connection still open after %v", timeout)
			}
			return websocket.CloseStatus(err)
		}
		if typ == websocket.MessageText && string(data) == "2" {
			ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
			_ = w.c.Write(ctx, websocket.MessageText, []byte("3"))
			cancel()
		}
	}
}
