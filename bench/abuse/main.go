// Command abuse runs the attacks joblib's budgets are meant to absorb against
// a real `joblib serve` process and prints, per attack, what the attacker got,
// the server's memory growth (peak VmRSS minus the RSS before), the server's
// CPU time, and the latency a well-behaved bystander saw meanwhile (a REST
// listing and a Socket.IO acknowledged event, every 100 ms).
//
//	go run ./bench/abuse                       # SQLite, the serve binary built from this module
//	go run ./bench/abuse -db postgres://postgres@127.0.0.1:5432/test?sslmode=disable
//	go run ./bench/abuse -serve /tmp/joblib-old -only list-offset,bad-bytes
//
// The server runs as a child process with its own database (a temporary SQLite
// file, or a fresh schema of -db), so its RSS and CPU are its own. Attacks run
// one after another, each on a freshly started process (same database) and
// bounded by -timeout.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/zndraw/joblib/internal/sio/sioclient"
	"github.com/zndraw/joblib/models"
)

const adminToken = "jl_abuse_6471866c07f8182ec331d5c31eb69a4781aab76a" // long enough for serve's admin token check

type options struct {
	serveBin string
	dbURL    string
	tasks    int
	only     map[string]bool
	timeout  time.Duration
	fresh    bool
}

func main() {
	var o options
	var only string
	flag.StringVar(&o.serveBin, "serve", "", "joblib binary to run (default: build ./cmd/joblib of this module)")
	flag.StringVar(&o.dbURL, "db", "", "PostgreSQL URL to run on (a fresh schema); default a temporary SQLite file")
	flag.IntVar(&o.tasks, "tasks", 100000, "pending tasks seeded in the room the listing and @internal attacks target")
	flag.StringVar(&only, "only", "", "comma-separated attack names to run (default all)")
	flag.DurationVar(&o.timeout, "timeout", 90*time.Second, "bound of each attack")
	flag.BoolVar(&o.fresh, "fresh", true, "restart the server (same database) before each attack")
	flag.Parse()
	if only != "" {
		o.only = map[string]bool{}
		for _, n := range strings.Split(only, ",") {
			o.only[strings.TrimSpace(n)] = true
		}
	}
	if err := run(context.Background(), o); err != nil {
		fmt.Fprintln(os.Stderr, "abuse:", err)
		os.Exit(1)
	}
}

// --- the server process

type serverProc struct {
	cmd    *exec.Cmd
	addr   string
	dbURL  string
	bin    string
	logMu  sync.Mutex
	errors int // log lines at ERROR level
}

func (s *serverProc) base() string { return "http://" + s.addr }

// stop ends the server (SIGTERM, then SIGKILL after 10 s).
func (s *serverProc) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
}

func (s *serverProc) errorLines() int {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	return s.errors
}

func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func prepareDB(ctx context.Context, dbURL string) (string, func(), error) {
	if dbURL == "" {
		dir, err := os.MkdirTemp("", "joblib-abuse-")
		if err != nil {
			return "", nil, err
		}
		return filepath.Join(dir, "abuse.db"), func() { os.RemoveAll(dir) }, nil
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return "", nil, err
	}
	schema := fmt.Sprintf("abuse_%d", time.Now().UnixNano())
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return "", nil, err
	}
	sep := "?"
	if strings.Contains(dbURL, "?") {
		sep = "&"
	}
	return dbURL + sep + "search_path=" + schema, func() {
		_, _ = conn.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		conn.Close(context.Background())
	}, nil
}

func startServer(ctx context.Context, bin, dbURL string) (*serverProc, error) {
	addr, err := freePort()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, bin, "serve")
	cmd.Env = append(os.Environ(), "JOBLIB_DATABASE_URL="+dbURL, "JOBLIB_ADMIN_TOKEN="+adminToken,
		"JOBLIB_LISTEN_ADDR="+addr, "JOBLIB_LOG_LEVEL=warn", "JOBLIB_NODE_ID=abuse")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &serverProc{cmd: cmd, addr: addr, dbURL: dbURL, bin: bin}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "level=ERROR") {
				s.logMu.Lock()
				s.errors++
				s.logMu.Unlock()
			}
		}
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		res, err := http.Get(s.base() + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return s, nil
			}
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			return nil, errors.New("joblib serve did not become ready")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// token creates a regular user and returns an API token for it.
func (s *serverProc) token(user string, superuser bool) (string, error) {
	args := []string{"token", "create", "--user", user}
	if superuser {
		args = append(args, "--superuser")
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Env = append(os.Environ(), "JOBLIB_DATABASE_URL="+s.dbURL, "JOBLIB_LOG_LEVEL=error")
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("token create %s: %w", user, err)
	}
	fields := strings.Fields(string(out))
	for _, f := range fields {
		if strings.HasPrefix(f, "jl_") {
			return f, nil
		}
	}
	return "", fmt.Errorf("no token in %q", out)
}

// procStat reads the server's RSS (bytes) and CPU time (user+system).
func (s *serverProc) procStat() (rss int64, cpu time.Duration) {
	pid := s.cmd.Process.Pid
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				rss = kb << 10
			}
		}
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
		if len(f) > 12 {
			ut, _ := strconv.ParseInt(f[11], 10, 64)
			st, _ := strconv.ParseInt(f[12], 10, 64)
			cpu = time.Duration(ut+st) * 10 * time.Millisecond // USER_HZ = 100
		}
	}
	return rss, cpu
}

// --- HTTP and Socket.IO clients

var httpc = &http.Client{Timeout: 180 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}

func call(method, url, token string, body []byte, hdr ...string) (int, []byte, error) {
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, h := range hdr {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(k, strings.TrimSpace(v))
	}
	res, err := httpc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	out, err := io.ReadAll(res.Body)
	return res.StatusCode, out, err
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// sock is a Socket.IO connection (internal/sio/sioclient); c is its
// websocket, for the attacks' hand-made frames.
type sock struct {
	cl     *sioclient.Client
	c      *websocket.Conn
	closed <-chan struct{}
}

// dialSocket connects with the token; on, if set, receives the server's
// events.
func dialSocket(ctx context.Context, base, token string, hdr http.Header, on func(sioclient.Event)) (*sock, error) {
	cl, err := sioclient.Dial(ctx, base, sioclient.Options{
		Auth: map[string]string{"token": token}, Header: hdr, ReadLimit: 64 << 20, OnEvent: on,
	})
	if err != nil {
		return nil, err
	}
	return &sock{cl: cl, c: cl.Conn(), closed: cl.Done()}, nil
}

// emit sends an event with an ack and returns the channel of its answer.
func (s *sock) emit(ctx context.Context, event string, payload any) (<-chan sioclient.Ack, error) {
	return s.cl.Go(ctx, event, payload)
}

func (s *sock) call(ctx context.Context, event string, payload any) (sioclient.Ack, error) {
	return s.cl.Call(ctx, event, payload)
}

// ackOK reports whether an acknowledgement says {"ok": true}.
func ackOK(a sioclient.Ack) bool {
	var r struct {
		OK bool `json:"ok"`
	}
	return a.Decode(&r) == nil && r.OK
}

// --- measurement

// bystander is a well-behaved client: every 100 ms a REST listing and a
// Socket.IO acknowledged join_room, each timed.
type bystander struct {
	rest, ack []time.Duration
	fails     int
}

func runBystander(ctx context.Context, base, token string) *bystander {
	b := &bystander{}
	s, err := dialSocket(ctx, base, token, nil, nil)
	if err != nil {
		b.fails++
		return b
	}
	defer s.cl.Kill()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return b
		case <-t.C:
		}
		start := time.Now()
		st, _, err := call("GET", base+"/v1/joblib/rooms/calm/jobs", token, nil)
		if err != nil || st != 200 {
			b.fails++
		} else {
			b.rest = append(b.rest, time.Since(start))
		}
		start = time.Now()
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err = s.call(actx, "join_room", map[string]string{"room_id": "calm"})
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return b
			}
			b.fails++
			if s2, err := dialSocket(ctx, base, token, nil, nil); err == nil {
				s.cl.Kill()
				s = s2
			}
		} else {
			b.ack = append(b.ack, time.Since(start))
		}
	}
}

func maxDur(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return slices.Max(d)
}

func p50(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

type result struct {
	name, outcome string
	rssGrowth     int64
	cpu           time.Duration
	by            *bystander
	errLines      int
}

type env struct {
	srv             *serverProc
	userA, userB    string // regular users
	calm            string // the bystander (regular user)
	tasks           int
	timeout         time.Duration
	bigJob, bigRoom string
}

// measure runs one attack with the bystander alongside, sampling RSS.
func measure(ctx context.Context, e *env, name string, attack func(ctx context.Context) string) result {
	time.Sleep(500 * time.Millisecond) // let the previous attack's garbage settle
	rss0, cpu0 := e.srv.procStat()
	errs0 := e.srv.errorLines()
	actx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	bctx, bcancel := context.WithCancel(ctx)
	var by *bystander
	var wg sync.WaitGroup
	wg.Go(func() { by = runBystander(bctx, e.srv.base(), e.calm) })
	var peak atomic.Int64
	peak.Store(rss0)
	sctx, scancel := context.WithCancel(ctx)
	wg.Go(func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
				if r, _ := e.srv.procStat(); r > peak.Load() {
					peak.Store(r)
				}
			}
		}
	})
	time.Sleep(300 * time.Millisecond) // bystander baseline
	outcome := attack(actx)
	time.Sleep(300 * time.Millisecond)
	if r, _ := e.srv.procStat(); r > peak.Load() {
		peak.Store(r)
	}
	_, cpu1 := e.srv.procStat()
	bcancel()
	scancel()
	wg.Wait()
	return result{name: name, outcome: outcome, rssGrowth: peak.Load() - rss0, cpu: cpu1 - cpu0, by: by, errLines: e.srv.errorLines() - errs0}
}

func randomHash() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func statusCounts(codes []int) string {
	m := map[int]int{}
	for _, c := range codes {
		m[c]++
	}
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d×%d", m[k], k))
	}
	return strings.Join(parts, " ")
}

func run(ctx context.Context, o options) error {
	bin := o.serveBin
	if bin == "" {
		dir, err := os.MkdirTemp("", "joblib-abuse-bin-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		bin = filepath.Join(dir, "joblib")
		build := exec.Command("go", "build", "-o", bin, "./cmd/joblib")
		build.Stderr = os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("build joblib: %w", err)
		}
	}
	dbURL, cleanup, err := prepareDB(ctx, o.dbURL)
	if err != nil {
		return err
	}
	defer cleanup()
	srv, err := startServer(ctx, bin, dbURL)
	if err != nil {
		return err
	}
	defer func() { srv.stop() }()
	e := &env{srv: srv, tasks: o.tasks, timeout: o.timeout, bigRoom: "big"}
	if e.userA, err = srv.token("alice", false); err != nil {
		return err
	}
	if e.userB, err = srv.token("bob", false); err != nil {
		return err
	}
	if e.calm, err = srv.token("carol", false); err != nil {
		return err
	}
	// The big room: a job and -tasks pending tasks, seeded in bulk.
	st, body, err := call("PUT", srv.base()+"/v1/joblib/rooms/@global/jobs", adminToken, mustJSON(map[string]any{"category": "modifiers", "name": "Abuse", "schema": map[string]any{}}))
	if err != nil || st/100 != 2 {
		return fmt.Errorf("register job: %d %s %v", st, body, err)
	}
	var job struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(body, &job)
	e.bigJob = "@global:modifiers:Abuse"
	db, err := models.Open(ctx, dbURL, models.OpenOptions{})
	if err != nil {
		return err
	}
	seedStart := time.Now()
	if err := db.Q(ctx).SeedPendingTasks(uuid.MustParse(job.ID), e.bigRoom, o.tasks); err != nil {
		return err
	}
	db.Close()
	database := "sqlite"
	if o.dbURL != "" {
		database = "postgres"
	}
	fmt.Printf("server %s, database %s, %d pending tasks seeded in %s\n\n", bin, database, o.tasks, time.Since(seedStart).Round(time.Millisecond))

	fmt.Printf("| attack | outcome | RSS growth | CPU | bystander REST p50 / max | bystander ack p50 / max | bystander failures | ERROR log lines |\n")
	fmt.Printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, a := range attacks {
		if o.only != nil && !o.only[a.name] {
			continue
		}
		if o.fresh {
			// A fresh process on the same database: each attack's memory
			// growth is measured from a clean heap.
			srv.stop()
			if e.srv, err = startServer(ctx, bin, dbURL); err != nil {
				return err
			}
			srv = e.srv
		}
		r := measure(ctx, e, a.name, func(ctx context.Context) string { return a.run(ctx, e) })
		fmt.Printf("| %s | %s | %.1f MB | %d ms | %s / %s | %s / %s | %d | %d |\n", r.name, r.outcome, float64(r.rssGrowth)/(1<<20),
			r.cpu.Milliseconds(), ms(p50(r.by.rest)), ms(maxDur(r.by.rest)), ms(p50(r.by.ack)), ms(maxDur(r.by.ack)), r.by.fails, r.errLines)
		if err := srv.cmd.Process.Signal(syscall.Signal(0)); err != nil {
			return fmt.Errorf("the server died during %s", a.name)
		}
	}
	return nil
}

var jsonUnmarshal = json.Unmarshal

// ms prints a duration in milliseconds with one decimal.
func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

type attack struct {
	name string
	run  func(ctx context.Context, e *env) string
}
