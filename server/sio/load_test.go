package sio

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// smallBufListener shrinks the kernel send buffer of every accepted connection,
// so that a client that stops reading blocks the server's writes after a few KB
// instead of a few MB.
type smallBufListener struct{ net.Listener }

func (l smallBufListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(8 << 10)
	}
	return c, err
}

// seqReader counts `42["seq",i,...]` packets on one websocket and checks that i
// arrives in order, answering pings. It stops at the first error or when the
// connection ends.
type seqReader struct {
	got  atomic.Int64
	errs chan error
	done chan struct{}
}

func readSeq(w *wsClient) *seqReader {
	r := &seqReader{errs: make(chan error, 1), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for {
			typ, data, err := w.readErr(time.Minute)
			if err != nil {
				return
			}
			if typ != websocket.MessageText {
				r.errs <- fmt.Errorf("unexpected binary frame")
				return
			}
			s := string(data)
			if s == "2" {
				ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
				_ = w.c.Write(ctx, websocket.MessageText, []byte("3"))
				cancel()
				continue
			}
			if err := r.check(s); err != nil {
				r.errs <- err
				return
			}
		}
	}()
	return r
}

func (r *seqReader) check(pkt string) error {
	if !strings.HasPrefix(pkt, `42["seq",`) {
		return fmt.Errorf("unexpected packet %.60q", pkt)
	}
	var arr []json.RawMessage
	if err := json.Unmarshal([]byte(pkt[2:]), &arr); err != nil {
		return err
	}
	var i int64
	if err := json.Unmarshal(arr[1], &i); err != nil {
		return err
	}
	if want := r.got.Load(); i != want {
		return fmt.Errorf("got seq %d, want %d", i, want)
	}
	r.got.Add(1)
	return nil
}

func (r *seqReader) failed() error {
	select {
	case err := <-r.errs:
		return err
	default:
		return nil
	}
}

// The load tests run serially (no t.Parallel) so that they do not starve the
// timing-sensitive tests, which all run in parallel after them.

func TestSlowConsumerIsolated(t *testing.T) {
	const (
		good  = 100
		total = 250 // the slow client's queue (64) and socket buffers overflow after ~100
		batch = 16
	)
	cfg := Config{
		PingInterval:   time.Minute, // the slow client never answers pings; keep them out of the way
		PingTimeout:    time.Minute,
		SendQueue:      64,
		WriteTimeout:   time.Minute, // overflow, not a write timeout, must catch the slow client
		ConnectTimeout: 10 * time.Second,
	}
	h := newTestHandler()
	h.onConnect = func(s *Socket) error { s.Join("r"); return nil }
	srv := New(cfg, h)
	h.srv = srv
	mux := http.NewServeMux()
	mux.Handle("/socket.io/", srv)
	hs := httptest.NewUnstartedServer(mux)
	hs.Listener = smallBufListener{hs.Listener}
	hs.Start()
	ts := &testServer{srv: srv, h: h, http: hs, url: hs.URL}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		hs.Close()
	})

	readers := make([]*seqReader, good)
	for i := range readers {
		w, _ := connectWS(t, ts)
		readers[i] = readSeq(w)
	}

	// The slow client joins and then never reads again; its receive buffer is tiny.
	dialer := &net.Dialer{}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(4 << 10)
		}
		return c, err
	}}}
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	sc, _, err := websocket.Dial(ctx, ts.wsEndpoint("EIO=4&transport=websocket"), &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sc.CloseNow() })
	slow := &wsClient{t: t, c: sc}
	slow.read() // open
	slow.send("40")
	slowID := socketIDFrom(t, slow.next())
	eventually(t, ioTimeout, "all sockets in the room", func() bool { return srv.RoomSize("r") == good+1 })

	pad := strings.Repeat("x", 1024)
	var slowest time.Duration
	for i := range total {
		start := time.Now()
		if err := srv.EmitTo("r", "seq", i, pad); err != nil {
			t.Fatal(err)
		}
		slowest = max(slowest, time.Since(start))
		if i%batch == batch-1 || i == total-1 {
			// Pace the broadcast so the good clients never come near their queue limit.
			want := int64(i + 1)
			eventually(t, 30*time.Second, fmt.Sprintf("good clients at %d", want), func() bool {
				for _, r := range readers {
					if err := r.failed(); err != nil {
						t.Fatal(err)
					}
					if r.got.Load() < want {
						return false
					}
				}
				return true
			})
		}
	}
	for i, r := range readers {
		if n := r.got.Load(); n != total {
			t.Errorf("good client %d got %d of %d", i, n, total)
		}
	}
	rec := h.waitDisconnect(t, ioTimeout)
	if rec.id != slowID || rec.reason != ReasonSlowConsumer {
		t.Fatalf("OnDisconnect %+v, want slow consumer for %s", rec, slowID)
	}
	select {
	case rec := <-h.disconnCh:
		t.Fatalf("another socket was disconnected: %+v", rec)
	default:
	}
	if n := srv.RoomSize("r"); n != good {
		t.Fatalf("room has %d members, want %d", n, good)
	}
	if slowest > time.Second {
		t.Fatalf("an EmitTo call took %v: broadcast waited on a socket", slowest)
	}
	// If the slow client now reads, it finds at most a slow-consumer close frame.
	for {
		_, _, err := slow.readErr(10 * time.Second)
		if err != nil {
			if code := websocket.CloseStatus(err); code != -1 && code != CloseCodeSlowConsumer {
				t.Fatalf("slow client close code %d", code)
			}
			break
		}
	}
}

func TestManyClientsInOrder(t *testing.T) {
	const (
		wsClients   = 40
		pollClients = 5
		messages    = 200
	)
	h := newTestHandler()
	h.onConnect = func(s *Socket) error { s.Join("all"); return nil }
	// Pings queue behind the broadcast (as in the reference server); under -race a
	// client needs more than the compliance suites' 200 ms to drain 200 messages.
	cfg := testConfig()
	cfg.PingInterval, cfg.PingTimeout = time.Second, 10*time.Second
	ts := startServer(t, cfg, h)
	t.Cleanup(func() {
		if t.Failed() {
			h.mu.Lock()
			t.Logf("disconnects: %v", h.disconnects)
			h.mu.Unlock()
		}
	})

	readers := make([]*seqReader, wsClients)
	for i := range readers {
		w, _ := connectWS(t, ts)
		readers[i] = readSeq(w)
	}
	type pollResult struct {
		got int
		err error
	}
	pollDone := make(chan pollResult, pollClients)
	var wg sync.WaitGroup
	for range pollClients {
		pc, _ := pollOpen(t, ts)
		pc.connect()
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &seqReader{}
			res := pollResult{}
			defer func() { res.got = int(r.got.Load()); pollDone <- res }()
			client := &http.Client{Timeout: 30 * time.Second}
			for r.got.Load() < messages {
				resp, err := client.Get(pc.url())
				if err != nil {
					res.err = err
					return
				}
				var body strings.Builder
				_, _ = fmt.Fprint(&body, readAll(resp))
				for _, p := range strings.Split(body.String(), "\x1e") {
					if p == "2" {
						pr, err := client.Post(pc.url(), "text/plain", strings.NewReader("3"))
						if err != nil {
							res.err = err
							return
						}
						pr.Body.Close()
						continue
					}
					if err := r.check(p); err != nil {
						res.err = err
						return
					}
				}
			}
		}()
	}
	eventually(t, ioTimeout, "all sockets in the room", func() bool { return ts.srv.RoomSize("all") == wsClients+pollClients })

	for i := range messages {
		if err := ts.srv.EmitTo("all", "seq", i); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, "every websocket client has every message", func() bool {
		for _, r := range readers {
			if err := r.failed(); err != nil {
				t.Fatal(err)
			}
			if r.got.Load() < messages {
				return false
			}
		}
		return true
	})
	wg.Wait()
	for range pollClients {
		res := <-pollDone
		if res.err != nil || res.got != messages {
			t.Fatalf("polling client: got %d of %d: %v", res.got, messages, res.err)
		}
	}
	for i, r := range readers {
		if n := r.got.Load(); n != messages {
			t.Fatalf("websocket client %d got %d", i, n)
		}
	}
}

func readAll(resp *http.Response) string {
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}
