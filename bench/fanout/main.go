// Command fanout measures Socket.IO broadcast latency and server memory per idle
// connection for server/sio.
//
// The parent process runs an sio.Server on 127.0.0.1:0 whose handler joins a
// socket to room "r" on a "join" event. It starts itself again as a child
// process that opens -conns raw websocket clients (coder/websocket, speaking
// Engine.IO/Socket.IO by hand) over loopback, so client memory and file
// descriptors do not count against the server. The parent reads VmRSS from
// /proc/self/status before and after the clients joined, then broadcasts
// -events timestamped events to the room; the child records the delivery
// latency of every event on every connection and reports percentiles.
//
//	go run ./bench/fanout -conns 1000 -events 200
//
// It stops by itself: every phase is bounded by -timeout.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/zndraw/joblib/server/sio"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "fanout:", err)
		os.Exit(1)
	}
}

type options struct {
	conns    int
	events   int
	interval time.Duration
	payload  int
	timeout  time.Duration
	dialers  int
	cpuprof  string
	memprof  string
	role     string
	url      string
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	var o options
	fs := flag.NewFlagSet("fanout", flag.ContinueOnError)
	fs.IntVar(&o.conns, "conns", 1000, "websocket connections")
	fs.IntVar(&o.events, "events", 200, "events broadcast to the room")
	fs.DurationVar(&o.interval, "interval", 10*time.Millisecond, "pause between events")
	fs.IntVar(&o.payload, "payload", 100, "bytes of padding per event")
	fs.DurationVar(&o.timeout, "timeout", 3*time.Minute, "hard limit for the whole run")
	fs.IntVar(&o.dialers, "dialers", 64, "parallel dials")
	fs.StringVar(&o.cpuprof, "cpuprofile", "", "write a CPU profile of the server during the broadcast phase")
	fs.StringVar(&o.memprof, "memprofile", "", "write a heap profile of the server with the idle connections")
	fs.StringVar(&o.role, "role", "server", "server (parent) or clients (child, internal)")
	fs.StringVar(&o.url, "url", "", "server URL (child only)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	if o.role == "clients" {
		return runClients(ctx, o, stdout)
	}
	return runServer(ctx, o, stdout)
}

// ---- parent: the server ----

type joinHandler struct{}

func (joinHandler) OnConnect(context.Context, *sio.Socket, *http.Request, json.RawMessage) error {
	return nil
}

func (joinHandler) OnEvent(_ context.Context, s *sio.Socket, ev sio.Event, ack sio.AckFunc) {
	if ev.Name == "join" {
		s.Join("r")
		if ack != nil {
			_ = ack("joined")
		}
	}
}

func (joinHandler) OnDisconnect(*sio.Socket, string) {}

func vmRSS() (int64, error) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("read VmRSS: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse VmRSS %q: %w", line, err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("read VmRSS: not found")
}

// settledRSS collects garbage and returns memory to the OS before measuring, so
// both measurements see live memory only.
func settledRSS() (int64, error) {
	runtime.GC()
	debug.FreeOSMemory()
	return vmRSS()
}

type clientReport struct {
	Conns      int     `json:"conns"`
	Joined     int     `json:"joined"`
	Expected   int64   `json:"expected"`
	Received   int64   `json:"received"`
	OutOfOrder int64   `json:"out_of_order"`
	P50us      float64 `json:"p50_us"`
	P99us      float64 `json:"p99_us"`
	MaxUS      float64 `json:"max_us"`
	ConnectSec float64 `json:"connect_s"`
	Error      string  `json:"error,omitempty"`
}

func runServer(ctx context.Context, o options, stdout io.Writer) error {
	srv := sio.New(sio.Config{Logger: slog.New(slog.DiscardHandler), MaxSessionsPerAddr: 1 << 20}, joinHandler{})
	mux := http.NewServeMux()
	mux.Handle("/socket.io/", srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()

	rssBefore, err := settledRSS()
	if err != nil {
		return err
	}
	goroutinesBefore := runtime.NumGoroutine()

	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find executable: %w", err)
	}
	child := exec.CommandContext(ctx, exe, "-role", "clients", "-url", "http://"+ln.Addr().String(),
		"-conns", strconv.Itoa(o.conns), "-events", strconv.Itoa(o.events), "-timeout", o.timeout.String(),
		"-dialers", strconv.Itoa(o.dialers))
	child.Stderr = os.Stderr
	out, err := child.StdoutPipe()
	if err != nil {
		return fmt.Errorf("child stdout: %w", err)
	}
	if err := child.Start(); err != nil {
		return fmt.Errorf("start clients: %w", err)
	}
	defer func() { _ = child.Wait() }()
	lines := bufio.NewScanner(out)
	lines.Buffer(make([]byte, 1<<20), 1<<20)

	// Phase 1: wait for every client to join.
	if !lines.Scan() || lines.Text() != "ready" {
		return fmt.Errorf("clients did not get ready: %q %v", lines.Text(), lines.Err())
	}
	for srv.RoomSize("r") < o.conns {
		if ctx.Err() != nil {
			return fmt.Errorf("room has %d of %d: %w", srv.RoomSize("r"), o.conns, ctx.Err())
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // let the joins' garbage become collectable
	rssAfter, err := settledRSS()
	if err != nil {
		return err
	}
	goroutinesAfter := runtime.NumGoroutine()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if o.memprof != "" {
		f, err := os.Create(o.memprof)
		if err != nil {
			return fmt.Errorf("create profile: %w", err)
		}
		if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
			return fmt.Errorf("write heap profile: %w", err)
		}
		f.Close()
	}

	// Phase 2: broadcast timestamped events.
	if o.cpuprof != "" {
		f, err := os.Create(o.cpuprof)
		if err != nil {
			return fmt.Errorf("create profile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("start profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	pad := strings.Repeat("x", o.payload)
	var slowestEmit time.Duration
	for i := range o.events {
		start := time.Now()
		if err := srv.EmitTo("r", "tick", i, start.UnixNano(), pad); err != nil {
			return err
		}
		slowestEmit = max(slowestEmit, time.Since(start))
		time.Sleep(o.interval)
	}

	// Phase 3: the child reports.
	if !lines.Scan() {
		return fmt.Errorf("no report from clients: %v", lines.Err())
	}
	var rep clientReport
	if err := json.Unmarshal(lines.Bytes(), &rep); err != nil {
		return fmt.Errorf("decode report %q: %w", lines.Text(), err)
	}
	perConn := float64(rssAfter-rssBefore) / float64(o.conns)
	fmt.Fprintf(stdout, "fanout: %d websocket connections (clients in a child process, loopback), %d events of %d B padding, %v apart\n",
		o.conns, o.events, o.payload, o.interval)
	fmt.Fprintf(stdout, "  connect+join: %.2fs\n", rep.ConnectSec)
	fmt.Fprintf(stdout, "  delivered: %d of %d (out of order: %d)%s\n", rep.Received, rep.Expected, rep.OutOfOrder, errSuffix(rep.Error))
	fmt.Fprintf(stdout, "  latency emit→client read: p50 %.0f µs, p99 %.0f µs, max %.0f µs\n", rep.P50us, rep.P99us, rep.MaxUS)
	fmt.Fprintf(stdout, "  slowest EmitTo call: %v\n", slowestEmit)
	fmt.Fprintf(stdout, "  server RSS: %.1f MiB before, %.1f MiB with idle connections: %.1f KiB per connection\n",
		float64(rssBefore)/(1<<20), float64(rssAfter)/(1<<20), perConn/1024)
	fmt.Fprintf(stdout, "  server heap in use %.1f KiB, stacks %.1f KiB per connection\n",
		float64(ms.HeapInuse)/float64(o.conns)/1024, float64(ms.StackInuse)/float64(o.conns)/1024)
	fmt.Fprintf(stdout, "  server goroutines: %d before, %d with connections (%.2f per connection)\n",
		goroutinesBefore, goroutinesAfter, float64(goroutinesAfter-goroutinesBefore)/float64(o.conns))
	if rep.Received != rep.Expected {
		return fmt.Errorf("lost deliveries: %d of %d", rep.Received, rep.Expected)
	}
	return nil
}

func errSuffix(s string) string {
	if s == "" {
		return ""
	}
	return " error: " + s
}

// ---- child: the clients ----

type client struct {
	c         *websocket.Conn
	latencies []int64 // ns
	next      int
	outOfOrd  int64
}

func runClients(ctx context.Context, o options, stdout io.Writer) error {
	wsURL := "ws" + strings.TrimPrefix(o.url, "http") + "/socket.io/?EIO=4&transport=websocket"
	clients := make([]*client, o.conns)
	start := time.Now()
	var (
		mu       sync.Mutex
		firstErr error
		joined   atomic.Int64
	)
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range o.dialers {
		wg.Go(func() {
			for i := range jobs {
				c, err := dialAndJoin(ctx, wsURL)
				if err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, fmt.Errorf("client %d: %w", i, err))
					mu.Unlock()
					continue
				}
				clients[i] = &client{c: c, latencies: make([]int64, 0, o.events)}
				joined.Add(1)
			}
		})
	}
	for i := range o.conns {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	connectSec := time.Since(start).Seconds()
	if firstErr != nil {
		return firstErr
	}
	fmt.Fprintln(stdout, "ready")

	var received, outOfOrder atomic.Int64
	readCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var rg sync.WaitGroup
	for _, cl := range clients {
		rg.Go(func() { cl.read(readCtx, o.events, &received) })
	}
	rg.Wait()

	var all []int64
	for _, cl := range clients {
		all = append(all, cl.latencies...)
		outOfOrder.Add(cl.outOfOrd)
		_ = cl.c.CloseNow()
	}
	slices.Sort(all)
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[min(len(all)-1, int(p*float64(len(all))))]) / 1e3
	}
	rep := clientReport{
		Conns: o.conns, Joined: int(joined.Load()), Expected: int64(o.conns) * int64(o.events), Received: received.Load(),
		OutOfOrder: outOfOrder.Load(), P50us: pct(0.50), P99us: pct(0.99), ConnectSec: connectSec,
	}
	if len(all) > 0 {
		rep.MaxUS = float64(all[len(all)-1]) / 1e3
	}
	if ctx.Err() != nil {
		rep.Error = ctx.Err().Error()
	}
	line, _ := json.Marshal(rep)
	fmt.Fprintln(stdout, string(line))
	return nil
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func dialAndJoin(ctx context.Context, url string) (*websocket.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(dctx, url, nil)
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	expect := func(prefix string) error {
		for {
			_, data, err := c.Read(dctx)
			if err != nil {
				return fmt.Errorf("read: %w", err)
			}
			if string(data) == "2" {
				if err := c.Write(dctx, websocket.MessageText, []byte("3")); err != nil {
					return err
				}
				continue
			}
			if !bytes.HasPrefix(data, []byte(prefix)) {
				return fmt.Errorf("got %.40q, want %q", data, prefix)
			}
			return nil
		}
	}
	steps := []struct{ send, want string }{{"", "0{"}, {"40", "40{"}, {`420["join"]`, `430[`}}
	for _, st := range steps {
		if st.send != "" {
			if err := c.Write(dctx, websocket.MessageText, []byte(st.send)); err != nil {
				c.CloseNow()
				return nil, fmt.Errorf("write: %w", err)
			}
		}
		if err := expect(st.want); err != nil {
			c.CloseNow()
			return nil, err
		}
	}
	return c, nil
}

// read records `42["tick",seq,sentUnixNano,pad]` until it has every event.
func (cl *client) read(ctx context.Context, events int, received *atomic.Int64) {
	prefix := []byte(`42["tick",`)
	for cl.next < events {
		_, data, err := cl.c.Read(ctx)
		now := time.Now().UnixNano()
		if err != nil {
			return
		}
		if string(data) == "2" {
			_ = cl.c.Write(ctx, websocket.MessageText, []byte("3"))
			continue
		}
		if !bytes.HasPrefix(data, prefix) {
			continue
		}
		rest := data[len(prefix):]
		seqEnd := bytes.IndexByte(rest, ',')
		seq, _ := strconv.Atoi(string(rest[:seqEnd]))
		rest = rest[seqEnd+1:]
		tsEnd := bytes.IndexByte(rest, ',')
		sent, _ := strconv.ParseInt(string(rest[:tsEnd]), 10, 64)
		if seq != cl.next {
			cl.outOfOrd++
		}
		cl.next = seq + 1
		cl.latencies = append(cl.latencies, now-sent)
		received.Add(1)
	}
}
