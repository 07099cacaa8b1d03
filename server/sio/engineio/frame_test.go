package engineio

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// connHandler remembers the sessions it opens.
type connHandler struct {
	echoHandler
	conns chan *Conn
}

func newConnHandler() *connHandler {
	return &connHandler{echoHandler: echoHandler{closed: make(chan string, 16)}, conns: make(chan *Conn, 16)}
}

func (h *connHandler) OnOpen(c *Conn, r *http.Request) error {
	h.conns <- c
	return nil
}

// smallSendBuffer shrinks the kernel send buffer of accepted connections, so
// that a client that does not read fills it after a few KiB.
type smallSendBuffer struct{ net.Listener }

func (l smallSendBuffer) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(4 << 10)
	}
	return c, err
}

func openWS(t *testing.T, h *connHandler, hs *httptest.Server) (*Conn, *websocket.Conn) {
	t.Helper()
	ws := dial(t, hs.URL, "")
	if _, open := read(t, ws); !strings.HasPrefix(open, "0{") {
		t.Fatalf("open %q", open)
	}
	select {
	case c := <-h.conns:
		return c, ws
	case <-time.After(ioTimeout):
		t.Fatal("no session")
	}
	return nil, nil
}

// TestSendWritesDirectly: on an idle websocket session, Send hands the frame
// to the socket from the caller's goroutine; no writer goroutine is started
// (a broadcast to N idle sockets wakes no goroutine).
func TestSendWritesDirectly(t *testing.T) {
	t.Parallel()
	h := newConnHandler()
	srv, hs := start(t, Config{PingInterval: time.Hour, PingTimeout: time.Hour}, h)
	c, ws := openWS(t, h, hs)
	deadline := time.Now().Add(ioTimeout)
	for srv.Goroutines() != 1 { // the reader; the open packet's writer has exited
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines on an idle session", srv.Goroutines())
		}
		time.Sleep(time.Millisecond)
	}
	before := srv.writers.Load()
	for i := range 100 {
		if err := c.Send(NewTextMessage(fmt.Sprint("m", i))); err != nil {
			t.Fatal(err)
		}
	}
	if n := srv.writers.Load() - before; n != 0 {
		t.Fatalf("%d writer goroutines started for 100 messages to an idle, reading client", n)
	}
	for i := range 100 {
		if _, got := read(t, ws); got != fmt.Sprint("4m", i) {
			t.Fatalf("message %d = %q", i, got)
		}
	}
}

// TestDirectWriteKeepsOrderWhenTheSocketIsFull: a message larger than the
// socket buffer is written in part directly and finished by the writer;
// messages sent meanwhile (text with binary attachments among them) arrive
// after it, whole and in order.
func TestDirectWriteKeepsOrderWhenTheSocketIsFull(t *testing.T) {
	t.Parallel()
	h := newConnHandler()
	srv := NewServer(Config{PingInterval: time.Hour, PingTimeout: time.Hour, SendQueue: 1 << 10}, h)
	hs := httptest.NewUnstartedServer(srv)
	hs.Listener = smallSendBuffer{hs.Listener}
	hs.Start()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		hs.Close()
	})
	c, ws := openWS(t, h, hs)
	ws.SetReadLimit(1 << 30)
	big := bytes.Repeat([]byte("abcdefgh"), 1<<17) // 1 MiB
	const small = 200
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := c.Send(NewMessage(big)); err != nil {
			t.Error(err)
		}
		for i := range small {
			var err error
			if i%10 == 0 {
				err = c.Send(NewMessage([]byte(fmt.Sprint("b", i)), []byte{byte(i), 1}, []byte{byte(i), 2}))
			} else {
				err = c.Send(NewTextMessage(fmt.Sprint("s", i)))
			}
			if err != nil {
				t.Error(err)
			}
		}
	})
	time.Sleep(50 * time.Millisecond) // let the socket buffer fill up before reading
	ctx, cancel := context.WithTimeout(context.Background(), 3*ioTimeout)
	defer cancel()
	next := func() (websocket.MessageType, []byte) {
		typ, b, err := ws.Read(ctx)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		return typ, b
	}
	if typ, b := next(); typ != websocket.MessageText || len(b) != len(big)+1 || b[0] != '4' || !bytes.Equal(b[1:], big) {
		t.Fatalf("big message: type %v, %d bytes, want %d", typ, len(b), len(big)+1)
	}
	for i := range small {
		if i%10 == 0 {
			if _, b := next(); string(b) != fmt.Sprint("4b", i) {
				t.Fatalf("message %d = %.40q", i, b)
			}
			for k := byte(1); k <= 2; k++ {
				if typ, b := next(); typ != websocket.MessageBinary || !bytes.Equal(b, []byte{byte(i), k}) {
					t.Fatalf("attachment %d of message %d = %v %v", k, i, typ, b)
				}
			}
			continue
		}
		if _, b := next(); string(b) != fmt.Sprint("4s", i) {
			t.Fatalf("message %d = %.40q", i, b)
		}
	}
	wg.Wait()
	if c.Closed() {
		t.Fatal("session closed")
	}
}

// TestHeartbeatWritesDirectly: the pings of an idle websocket session are
// written without starting a writer goroutine, and the session stays open
// while the client answers them.
func TestHeartbeatWritesDirectly(t *testing.T) {
	t.Parallel()
	h := newConnHandler()
	srv, hs := start(t, Config{PingInterval: 20 * time.Millisecond, PingTimeout: 5 * time.Second}, h)
	c, ws := openWS(t, h, hs)
	deadline := time.Now().Add(ioTimeout)
	for srv.writers.Load() == 0 || srv.Goroutines() != 1 { // the open packet's writer has come and gone
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines on an idle session", srv.Goroutines())
		}
		time.Sleep(time.Millisecond)
	}
	before := srv.writers.Load()
	for range 5 {
		if _, got := read(t, ws); got != "2" {
			t.Fatalf("got %q, want a ping", got)
		}
		write(t, ws, websocket.MessageText, "3")
	}
	if n := srv.writers.Load() - before; n != 0 {
		t.Fatalf("%d writer goroutines started for 5 pings", n)
	}
	if c.Closed() {
		t.Fatal("session closed")
	}
}

// The open packet is the first frame of a websocket session even when the
// first ping is due before the writer that sends the open packet has run: a
// heartbeat jumps queued messages, never the handshake. 300 sessions whose
// first ping is due at once (a 1 ns interval: the writer's first turn often
// comes after it; a starved machine can delay it past any interval). Before
// the fix the first few sessions already saw "2" first.
func TestOpenPacketGoesBeforeAnEarlyPing(t *testing.T) {
	t.Parallel()
	h := newConnHandler()
	_, hs := start(t, Config{PingInterval: time.Nanosecond, PingTimeout: 5 * time.Second}, h)
	for i := range 300 {
		ws := dial(t, hs.URL, "")
		if _, first := read(t, ws); !strings.HasPrefix(first, "0{") {
			t.Fatalf("session %d: first frame %q, want the open packet", i, first)
		}
		<-h.conns
		_ = ws.CloseNow()
	}
}
