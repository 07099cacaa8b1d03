// Command fanout measures Socket.IO broadcast latency, server memory per idle
// connection and server CPU per delivery, for joblib's server/sio and for the
// reference Node socket.io server, with the same load generator in the same
// run.
//
// For each server it starts a child process of itself that opens -conns
// websocket clients (internal/sio/sioclient, the client the SDK uses) over
// loopback, so client memory and file descriptors do not count against
// the server. joblib's server runs in this process; the Node server
// (bench/fanout/node, installed with `npm ci` from its lockfile on first use)
// runs as a child. Each client emits "join" and waits for its ack; the server
// joins it to room "r". Then the server's RSS is read (after a GC in both
// runtimes) and -events timestamped events are broadcast to the room; the
// clients record every delivery's latency and report percentiles. CPU is the
// server process's user+system time from the first broadcast until every
// delivery arrived, divided by the deliveries. With -rounds > 1 the servers
// alternate, so that both see the same machine load.
//
//	go run ./bench/fanout -conns 10000 -events 20 -rounds 2
//	go run ./bench/fanout -servers joblib -conns 1000   # joblib only, no Node needed
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
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/zndraw/joblib/internal/sio/sioclient"
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
	traceout string
	verbose  bool
	memprof  string
	servers  string
	rounds   int
	upgrade  bool
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
	fs.StringVar(&o.traceout, "trace", "", "write a runtime/trace of the joblib server during the broadcast phase")
	fs.BoolVar(&o.verbose, "v", false, "print the Go scheduler and GC figures of the server and the clients for every trial")
	fs.StringVar(&o.servers, "servers", "joblib,node", "servers to measure, in order: joblib, node")
	fs.IntVar(&o.rounds, "rounds", 1, "rounds (the servers alternate within each)")
	fs.BoolVar(&o.upgrade, "upgrade", false, "clients open with HTTP long-polling and upgrade to websocket (as browsers do)")
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
	return runAll(ctx, o, stdout)
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

// goMem is the Go heap and goroutine stacks in use (measured right after a
// GC by settledRSS): memory per connection without RSS's page granularity.
func goMem() int64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc + ms.StackInuse)
}

func vmRSS() (int64, error) { return readRSS("/proc/self/status") }

func rssOf(pid int) (int64, error) { return readRSS(fmt.Sprintf("/proc/%d/status", pid)) }

func readRSS(path string) (int64, error) {
	data, err := os.ReadFile(path)
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
	RT         rtDelta `json:"rt"`     // the clients' Go runtime while they read
	CPUus      float64 `json:"cpu_us"` // the clients' CPU per delivery
	Error      string  `json:"error,omitempty"`
}

// trial is one server's measurement.
type trial struct {
	server        string
	rep           clientReport
	kibPerConn    float64
	goroutines    float64 // per connection (joblib only)
	cpuPerDeliver float64 // µs
	slowestEmit   time.Duration
	rt            rtDelta // the server's Go runtime during the broadcasts (joblib only)
	goKiBPerConn  float64 // Go heap + goroutine stacks per connection (joblib only)
}

func runAll(ctx context.Context, o options, stdout io.Writer) error {
	servers := strings.Split(o.servers, ",")
	var trials []trial
	for round := range o.rounds {
		for _, name := range servers {
			var tr trial
			var err error
			switch name {
			case "joblib":
				tr, err = runJoblib(ctx, o)
			case "node":
				tr, err = runNode(ctx, o)
			default:
				return fmt.Errorf("unknown server %q", name)
			}
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", round+1, name, err)
			}
			trials = append(trials, tr)
			fmt.Fprintf(stdout, "round %d %-6s  p50 %7.1f ms  p99 %7.1f ms  max %7.1f ms  %5.1f KiB/conn  %5.2f µs CPU/delivery (clients %5.2f)  connect %.1fs  load %s%s\n",
				round+1, name, tr.rep.P50us/1e3, tr.rep.P99us/1e3, tr.rep.MaxUS/1e3, tr.kibPerConn, tr.cpuPerDeliver, tr.rep.CPUus, tr.rep.ConnectSec, loadAvg(), errSuffix(tr.rep.Error))
			if tr.rep.Received != tr.rep.Expected {
				return fmt.Errorf("%s lost deliveries: %d of %d", name, tr.rep.Received, tr.rep.Expected)
			}
			if o.verbose {
				if name == "joblib" {
					fmt.Fprintf(stdout, "        server: %v; slowest EmitTo %v; %.2f goroutines and %.1f KiB of Go heap+stacks per connection\n",
						tr.rt, tr.slowestEmit.Round(time.Microsecond), tr.goroutines, tr.goKiBPerConn)
				}
				fmt.Fprintf(stdout, "        clients: %v\n", tr.rep.RT)
			}
		}
	}
	kind := "websocket"
	if o.upgrade {
		kind = "upgraded (polling→websocket)"
	}
	fmt.Fprintf(stdout, "\nfanout: %d idle %s connections in one room (clients in a child process, loopback), %d events of %d B padding, %v apart, %d round(s); load average at the end: %s\n\n",
		o.conns, kind, o.events, o.payload, o.interval, o.rounds, loadAvg())
	fmt.Fprintln(stdout, "| server | p50 / p99 / max delivery (mean of rounds) | p99 range over rounds | RSS per connection | CPU per delivery (clients) |")
	fmt.Fprintln(stdout, "| --- | --- | --- | --- | --- |")
	for _, name := range servers {
		var p50, p99, mx, kib, cpu, ccpu float64
		lo, hi := math.Inf(1), 0.0
		n := 0.0
		for _, tr := range trials {
			if tr.server != name {
				continue
			}
			p50 += tr.rep.P50us / 1e3
			p99 += tr.rep.P99us / 1e3
			lo, hi = min(lo, tr.rep.P99us/1e3), max(hi, tr.rep.P99us/1e3)
			mx = max(mx, tr.rep.MaxUS/1e3)
			kib += tr.kibPerConn
			cpu += tr.cpuPerDeliver
			ccpu += tr.rep.CPUus
			n++
		}
		fmt.Fprintf(stdout, "| %s | %.1f / %.1f / %.1f ms | %.1f–%.1f ms | %.1f KiB | %.1f µs (%.1f µs) |\n", name, p50/n, p99/n, mx, lo, hi, kib/n, cpu/n, ccpu/n)
	}
	// Per-round ratios: each joblib round against the Node round next to it.
	var ratios []string
	for i := 0; i+1 < len(trials); i += 2 {
		a, b := trials[i], trials[i+1]
		if a.server == "joblib" && b.server == "node" && b.rep.P99us > 0 {
			ratios = append(ratios, fmt.Sprintf("%.2f", a.rep.P99us/b.rep.P99us))
		}
	}
	if len(ratios) > 0 {
		fmt.Fprintf(stdout, "\np99 joblib / Node per round: %s\n", strings.Join(ratios, " "))
	}
	return nil
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

// startClients runs the client child against url and waits for "ready".
func startClients(ctx context.Context, o options, url string) (*exec.Cmd, *bufio.Scanner, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, fmt.Errorf("find executable: %w", err)
	}
	child := exec.CommandContext(ctx, exe, "-role", "clients", "-url", url,
		"-conns", strconv.Itoa(o.conns), "-events", strconv.Itoa(o.events), "-timeout", o.timeout.String(),
		"-dialers", strconv.Itoa(o.dialers), "-upgrade="+strconv.FormatBool(o.upgrade))
	child.Stderr = os.Stderr
	out, err := child.StdoutPipe()
	if err != nil {
		return nil, nil, fmt.Errorf("child stdout: %w", err)
	}
	if err := child.Start(); err != nil {
		return nil, nil, fmt.Errorf("start clients: %w", err)
	}
	lines := bufio.NewScanner(out)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	if !lines.Scan() || lines.Text() != "ready" {
		_ = child.Wait()
		return nil, nil, fmt.Errorf("clients did not get ready: %q %v", lines.Text(), lines.Err())
	}
	return child, lines, nil
}

func readReport(lines *bufio.Scanner) (clientReport, error) {
	var rep clientReport
	if !lines.Scan() {
		return rep, fmt.Errorf("no report from clients: %v", lines.Err())
	}
	if err := json.Unmarshal(lines.Bytes(), &rep); err != nil {
		return rep, fmt.Errorf("decode report %q: %w", lines.Text(), err)
	}
	return rep, nil
}

// cpuSelf is this process's user+system CPU time.
func cpuSelf() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuOf is a process's user+system CPU time from /proc (clock ticks of 10 ms).
func cpuOf(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read cpu time: %w", err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

func runJoblib(ctx context.Context, o options) (trial, error) {
	tr := trial{server: "joblib"}
	srv := sio.New(sio.Config{Logger: slog.New(slog.DiscardHandler), MaxSessionsPerAddr: 1 << 20}, joinHandler{})
	mux := http.NewServeMux()
	mux.Handle("/socket.io/", srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return tr, fmt.Errorf("listen: %w", err)
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
		return tr, err
	}
	goBefore := goMem()
	goroutinesBefore := runtime.NumGoroutine()
	child, lines, err := startClients(ctx, o, "http://"+ln.Addr().String())
	if err != nil {
		return tr, err
	}
	defer func() { _ = child.Wait() }()
	for srv.RoomSize("r") < o.conns {
		if ctx.Err() != nil {
			return tr, fmt.Errorf("room has %d of %d: %w", srv.RoomSize("r"), o.conns, ctx.Err())
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // let the joins' garbage become collectable
	rssAfter, err := settledRSS()
	if err != nil {
		return tr, err
	}
	tr.goKiBPerConn = float64(goMem()-goBefore) / float64(o.conns) / 1024
	tr.goroutines = float64(runtime.NumGoroutine()-goroutinesBefore) / float64(o.conns)
	if o.memprof != "" {
		f, err := os.Create(o.memprof)
		if err != nil {
			return tr, fmt.Errorf("create profile: %w", err)
		}
		if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
			return tr, fmt.Errorf("write heap profile: %w", err)
		}
		f.Close()
	}
	if o.cpuprof != "" {
		f, err := os.Create(o.cpuprof)
		if err != nil {
			return tr, fmt.Errorf("create profile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return tr, fmt.Errorf("start profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	if o.traceout != "" {
		f, err := os.Create(o.traceout)
		if err != nil {
			return tr, fmt.Errorf("create trace: %w", err)
		}
		defer f.Close()
		if err := trace.Start(f); err != nil {
			return tr, fmt.Errorf("start trace: %w", err)
		}
		defer trace.Stop()
	}
	pad := strings.Repeat("x", o.payload)
	rt0 := readRT()
	cpu0 := cpuSelf()
	for i := range o.events {
		start := time.Now()
		if err := srv.EmitTo("r", "tick", i, start.UnixNano(), pad); err != nil {
			return tr, err
		}
		tr.slowestEmit = max(tr.slowestEmit, time.Since(start))
		time.Sleep(o.interval)
	}
	if tr.rep, err = readReport(lines); err != nil {
		return tr, err
	}
	cpu := cpuSelf() - cpu0
	tr.rt = rt0.delta(readRT())
	tr.kibPerConn = float64(rssAfter-rssBefore) / float64(o.conns) / 1024
	tr.cpuPerDeliver = float64(cpu.Microseconds()) / float64(max(1, tr.rep.Received))
	return tr, nil
}

// nodeDir holds the reference server and its lockfile.
func nodeDir() (string, error) {
	for _, d := range []string{"bench/fanout/node", "node", "../../bench/fanout/node"} {
		if _, err := os.Stat(filepath.Join(d, "package-lock.json")); err == nil {
			return filepath.Abs(d)
		}
	}
	return "", errors.New("bench/fanout/node not found: run from the repository root")
}

func runNode(ctx context.Context, o options) (trial, error) {
	tr := trial{server: "node"}
	dir, err := nodeDir()
	if err != nil {
		return tr, err
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "socket.io")); err != nil {
		install := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--prefix", dir)
		install.Stdout, install.Stderr = os.Stderr, os.Stderr
		if err := install.Run(); err != nil {
			return tr, fmt.Errorf("npm ci in %s: %w", dir, err)
		}
	}
	cmd := exec.CommandContext(ctx, "node", "--expose-gc", filepath.Join(dir, "server.mjs"))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return tr, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return tr, err
	}
	if err := cmd.Start(); err != nil {
		return tr, fmt.Errorf("start node: %w", err)
	}
	defer func() {
		stdin.Close()
		_ = cmd.Wait()
	}()
	srvOut := bufio.NewScanner(out)
	expect := func(prefix string) (string, error) {
		if !srvOut.Scan() || !strings.HasPrefix(srvOut.Text(), prefix) {
			return "", fmt.Errorf("node server: got %q, want %q (%v)", srvOut.Text(), prefix, srvOut.Err())
		}
		return srvOut.Text(), nil
	}
	portLine, err := expect("port ")
	if err != nil {
		return tr, err
	}
	rss := func() (int64, error) {
		if _, err := io.WriteString(stdin, "gc\n"); err != nil {
			return 0, err
		}
		if _, err := expect("collected"); err != nil {
			return 0, err
		}
		return rssOf(cmd.Process.Pid)
	}
	rssBefore, err := rss()
	if err != nil {
		return tr, err
	}
	child, lines, err := startClients(ctx, o, "http://127.0.0.1:"+strings.TrimPrefix(portLine, "port "))
	if err != nil {
		return tr, err
	}
	defer func() { _ = child.Wait() }()
	time.Sleep(500 * time.Millisecond)
	rssAfter, err := rss()
	if err != nil {
		return tr, err
	}
	cpu0, err := cpuOf(cmd.Process.Pid)
	if err != nil {
		return tr, err
	}
	if _, err := fmt.Fprintf(stdin, "emit %d %d %d\n", o.events, o.interval.Milliseconds(), o.payload); err != nil {
		return tr, err
	}
	if tr.rep, err = readReport(lines); err != nil {
		return tr, err
	}
	cpu1, err := cpuOf(cmd.Process.Pid)
	if err != nil {
		return tr, err
	}
	if _, err := expect("emitted"); err != nil {
		return tr, err
	}
	tr.kibPerConn = float64(rssAfter-rssBefore) / float64(o.conns) / 1024
	tr.cpuPerDeliver = float64((cpu1 - cpu0).Microseconds()) / float64(max(1, tr.rep.Received))
	return tr, nil
}

func errSuffix(s string) string {
	if s == "" {
		return ""
	}
	return " error: " + s
}

// ---- child: the clients ----

// client is one connection; its fields are written by its read goroutine
// (onEvent) until full is closed or the connection is killed.
type client struct {
	c         *sioclient.Client
	latencies []int64 // ns
	next      int
	outOfOrd  int64
	want      int
	received  *atomic.Int64
	full      chan struct{} // closed when every event arrived
}

func runClients(ctx context.Context, o options, stdout io.Writer) error {
	clients := make([]*client, o.conns)
	start := time.Now()
	var (
		mu       sync.Mutex
		firstErr error
		joined   atomic.Int64
		received atomic.Int64
	)
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range o.dialers {
		wg.Go(func() {
			for i := range jobs {
				cl := &client{latencies: make([]int64, 0, o.events), want: o.events, received: &received, full: make(chan struct{})}
				if err := cl.dialAndJoin(ctx, o); err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, fmt.Errorf("client %d: %w", i, err))
					mu.Unlock()
					continue
				}
				clients[i] = cl
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

	var outOfOrder atomic.Int64
	rt0 := readRT()
	ccpu0 := cpuSelf()
	for _, cl := range clients {
		select {
		case <-cl.full:
		case <-cl.c.Done():
		case <-ctx.Done():
		}
	}
	rtRead := rt0.delta(readRT())
	clientCPU := cpuSelf() - ccpu0

	var all []int64
	for _, cl := range clients {
		cl.c.Kill()
		<-cl.c.Done() // its read goroutine no longer writes cl's fields
		all = append(all, cl.latencies...)
		outOfOrder.Add(cl.outOfOrd)
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
		RT: rtRead, CPUus: float64(clientCPU.Microseconds()) / float64(max(1, received.Load())),
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

var pollClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1 << 16}, Timeout: 30 * time.Second}

// dialAndJoin connects (with -upgrade over HTTP long-polling first, then
// upgraded to websocket) and emits "join", waiting for its ack.
func (cl *client) dialAndJoin(ctx context.Context, o options) error {
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := sioclient.Dial(dctx, o.url, sioclient.Options{Upgrade: o.upgrade, HTTPClient: pollClient, OnEvent: cl.onEvent})
	if err != nil {
		return err
	}
	if _, err := c.Call(dctx, "join"); err != nil {
		c.Kill()
		return fmt.Errorf("join: %w", err)
	}
	cl.c = c
	return nil
}

// onEvent records `tick(seq, sentUnixNano, pad)` until it has every event.
func (cl *client) onEvent(ev sioclient.Event) {
	now := time.Now().UnixNano()
	if ev.Name != "tick" || cl.next >= cl.want {
		return
	}
	var seq int
	var sent int64
	if ev.Decode(&seq, &sent) != nil {
		return
	}
	if seq != cl.next {
		cl.outOfOrd++
	}
	cl.next = seq + 1
	cl.latencies = append(cl.latencies, now-sent)
	cl.received.Add(1)
	if cl.next >= cl.want {
		close(cl.full)
	}
}
