// Command soak runs `joblib serve` under churn for a bounded time and reports
// the server's resources over time and an exact final accounting.
//
// The server is a child process on SQLite (a temporary file) or PostgreSQL
// (a private schema, dropped at the end). Against it run, in this process:
//
//   - socket workers: REST registration, then a websocket Socket.IO
//     connection that joins the job room and claims on task_available; the
//     churn kills one at random now and then (the connection is dropped
//     without a word, claimed work is abandoned) and starts a replacement;
//   - REST workers: heartbeat and claim-poll over REST; the churn makes one
//     go silent (no heartbeat, no delete) or leave gracefully, and starts a
//     replacement;
//   - UIs: websocket Socket.IO connections that join rooms and check every
//     task_status_event (no status twice, none out of order on one
//     connection); the churn reconnects one now and then;
//   - a submitter: -rate tasks per second over -rooms rooms.
//
// Every -sample it prints the server's RSS, Go heap, goroutines, open file
// descriptors, sockets, task rows and table size. At the end it stops
// submitting, lets the workers drain, kills every worker at once, waits for
// the server to clean them, and checks: every submitted task is in the
// database exactly once or was deleted by retention (counted by
// joblib_tasks_deleted_total), no task is held by a worker that does not
// exist, no UI saw an event twice or out of order; then it compares the
// resources with the baseline taken before the load and times SIGTERM.
//
//	go run ./bench/soak -db postgres -duration 3m
//
// Run it from the repository root (it builds ./cmd/joblib unless -bin is given).
//
// With -measure it takes one of the reliability figures instead (see
// reliability.go and BENCHMARKS.md):
//
//	go run ./bench/soak -measure detection -n 20        # latency per cleanup path
//	go run ./bench/soak -measure false-positives -duration 10m -socket-workers 50 -rest-workers 50
//	go run ./bench/soak -measure sigkill -n 20          # SIGKILL → the UI's task_status_event
package main

import (
	"bufio"
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/zndraw/joblib/internal/sio/sioclient"
	"github.com/zndraw/joblib/models"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "hold-worker" {
		if err := holdWorker(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "hold-worker:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

type options struct {
	duration      time.Duration
	db            string
	pgURL         string
	bin           string
	rate          float64
	socketWorkers int
	restWorkers   int
	uis           int
	rooms         int
	churn         time.Duration
	sample        time.Duration
	retention     time.Duration
	workerTimeout time.Duration
	sweepInterval time.Duration
	grace         time.Duration
	keep          bool
	vacuum        time.Duration
	measure       string // "" (the soak), detection, false-positives or sigkill
	n             int    // workers per path (detection), rounds (sigkill)
	stress        bool
}

const maxDuration = 2 * time.Hour

func run(ctx context.Context, args []string, stdout io.Writer) error {
	var o options
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.DurationVar(&o.duration, "duration", 3*time.Minute, "how long the load runs (at most 2h); the final phase adds about a minute")
	fs.StringVar(&o.db, "db", "postgres", "postgres or sqlite")
	fs.StringVar(&o.pgURL, "pg", cmpOr(os.Getenv("JOBLIB_TEST_DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "PostgreSQL URL (a private schema is created in it)")
	fs.StringVar(&o.bin, "bin", "", "joblib binary (default: go build ./cmd/joblib)")
	fs.Float64Var(&o.rate, "rate", 20, "tasks submitted per second")
	fs.IntVar(&o.socketWorkers, "socket-workers", 8, "socket workers alive at a time")
	fs.IntVar(&o.restWorkers, "rest-workers", 4, "REST workers alive at a time")
	fs.IntVar(&o.uis, "uis", 10, "UI connections")
	fs.IntVar(&o.rooms, "rooms", 5, "rooms tasks are submitted to")
	fs.DurationVar(&o.churn, "churn", 3*time.Second, "mean pause between churn actions (a kill, a worker going silent, a UI reconnecting)")
	fs.DurationVar(&o.sample, "sample", 15*time.Second, "resource sampling period")
	fs.DurationVar(&o.retention, "retention", time.Minute, "JOBLIB_TASK_RETENTION_COMPLETED and _FAILED of the server (0 keeps tasks)")
	fs.DurationVar(&o.workerTimeout, "worker-timeout", 10*time.Second, "JOBLIB_WORKER_TIMEOUT of the server")
	fs.DurationVar(&o.sweepInterval, "sweeper-interval", 2*time.Second, "JOBLIB_SWEEPER_INTERVAL of the server")
	fs.DurationVar(&o.grace, "grace", 2*time.Second, "JOBLIB_DISCONNECT_GRACE of the server")
	fs.StringVar(&o.measure, "measure", "", "instead of the soak, measure: detection (latency per cleanup path), false-positives (live workers reaped under load) or sigkill (a worker's SIGKILL to the UI's task_status_event)")
	fs.IntVar(&o.n, "n", 20, "-measure detection: workers per cleanup path; sigkill: rounds")
	fs.BoolVar(&o.stress, "stress", true, "-measure false-positives: run stress-ng on every CPU beside the server for the whole -duration")
	fs.BoolVar(&o.keep, "keep", false, "keep the database (schema or file) afterwards")
	fs.DurationVar(&o.vacuum, "vacuum", time.Minute, "PostgreSQL with autovacuum off (CI machines): VACUUM the tables this often, as autovacuum would (0: never)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.duration <= 0 || o.duration > maxDuration {
		return fmt.Errorf("-duration must be in (0, %s]", maxDuration)
	}
	if o.rate <= 0 || o.socketWorkers < 1 || o.restWorkers < 0 || o.uis < 0 || o.rooms < 1 {
		return errors.New("-rate, -socket-workers and -rooms must be positive")
	}
	// Everything, final phase included, ends within a bound.
	ctx, cancel := context.WithTimeout(ctx, o.duration+5*time.Minute)
	defer cancel()

	tmp, err := os.MkdirTemp("", "joblib-soak-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if o.bin == "" {
		o.bin = filepath.Join(tmp, "joblib")
		b := exec.CommandContext(ctx, "go", "build", "-o", o.bin, "./cmd/joblib")
		b.Stdout, b.Stderr = os.Stderr, os.Stderr
		if err := b.Run(); err != nil {
			return fmt.Errorf("build joblib (run from the repository root or pass -bin): %w", err)
		}
	}
	h := &harness{o: o, out: stdout, tmp: tmp, submitted: map[string]bool{}}
	if err := h.openDB(ctx); err != nil {
		return err
	}
	defer h.closeDB()
	if err := h.startServer(ctx); err != nil {
		return err
	}
	defer h.killServer()
	switch o.measure {
	case "":
		return h.soak(ctx)
	case "detection":
		return h.measureDetection(ctx)
	case "false-positives":
		return h.measureFalsePositives(ctx)
	case "sigkill":
		return h.measureSigkill(ctx)
	}
	return fmt.Errorf("-measure must be detection, false-positives or sigkill, not %q", o.measure)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// ---- the harness ----

type harness struct {
	o   options
	out io.Writer
	tmp string

	dbURL    string
	sqlite   string // file path on SQLite
	pgSchema string
	pg       *pgx.Conn // size queries on PostgreSQL
	db       *models.DB

	cmd     *exec.Cmd
	exited  chan struct{}
	base    string
	token   string
	http    *http.Client
	logPath string

	mu        sync.Mutex
	submitted map[string]bool
	uncertain int // submissions whose answer was lost

	submitErrs   atomic.Int64
	claims       atomic.Int64
	completed    atomic.Int64
	failedByUs   atomic.Int64
	abandoned    atomic.Int64 // tasks a killed worker held
	kills        atomic.Int64
	silenced     atomic.Int64
	graceful     atomic.Int64
	reaped404    atomic.Int64 // a live REST worker's heartbeat answered 404
	uiReconnects atomic.Int64
	uiEvents     atomic.Int64
	uiDup        atomic.Int64
	uiOrder      atomic.Int64
	workerErrs   atomic.Int64

	orderMu sync.Mutex
	orderBy map[string]int // "claimed→pending" → count
}

func (h *harness) openDB(ctx context.Context) error {
	switch h.o.db {
	case "sqlite":
		h.sqlite = filepath.Join(h.tmp, "soak.db")
		h.dbURL = h.sqlite
	case "postgres":
		conn, err := pgx.Connect(ctx, h.o.pgURL)
		if err != nil {
			return fmt.Errorf("connect to PostgreSQL at %s: %w", h.o.pgURL, err)
		}
		b := make([]byte, 5)
		_, _ = crand.Read(b)
		h.pgSchema = "soak_" + hex.EncodeToString(b)
		if _, err := conn.Exec(ctx, "CREATE SCHEMA "+h.pgSchema); err != nil {
			conn.Close(ctx)
			return fmt.Errorf("create schema: %w", err)
		}
		if _, err := conn.Exec(ctx, "SET search_path = "+h.pgSchema); err != nil {
			return err
		}
		h.pg = conn
		u, err := url.Parse(h.o.pgURL)
		if err != nil {
			return err
		}
		q := u.Query()
		q.Set("search_path", h.pgSchema)
		u.RawQuery = q.Encode()
		h.dbURL = u.String()
	default:
		return fmt.Errorf("-db must be postgres or sqlite, not %q", h.o.db)
	}
	return nil
}

func (h *harness) closeDB() {
	if h.db != nil {
		h.db.Close()
	}
	if h.pg != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if !h.o.keep {
			if _, err := h.pg.Exec(ctx, "DROP SCHEMA "+h.pgSchema+" CASCADE"); err != nil {
				fmt.Fprintln(os.Stderr, "drop schema:", err)
			}
		} else {
			fmt.Fprintf(h.out, "kept schema %s\n", h.pgSchema)
		}
		h.pg.Close(ctx)
	}
	if h.sqlite != "" && h.o.keep {
		dst := "soak-" + time.Now().Format("20060102-150405") + ".db"
		if err := os.Rename(h.sqlite, dst); err == nil {
			fmt.Fprintf(h.out, "kept database %s\n", dst)
		}
	}
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func (h *harness) startServer(ctx context.Context) error {
	addr, err := freePort()
	if err != nil {
		return err
	}
	if h.token == "" {
		b := make([]byte, 16) // serve refuses admin tokens under 32 characters
		_, _ = crand.Read(b)
		h.token = "jl_soak" + hex.EncodeToString(b)
	}
	h.base = "http://" + addr
	h.logPath = filepath.Join(h.tmp, "serve.log")
	logf, err := os.OpenFile(h.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	ret := h.o.retention.String()
	h.cmd = exec.Command(h.o.bin, "serve")
	h.cmd.Env = append(os.Environ(),
		"JOBLIB_DATABASE_URL="+h.dbURL, "JOBLIB_LISTEN_ADDR="+addr, "JOBLIB_ADMIN_TOKEN="+h.token,
		"JOBLIB_NODE_ID=soak", "JOBLIB_LOG_LEVEL=warn", "JOBLIB_LOG_FORMAT=json",
		"JOBLIB_WORKER_TIMEOUT="+h.o.workerTimeout.String(), "JOBLIB_SWEEPER_INTERVAL="+h.o.sweepInterval.String(), "JOBLIB_DISCONNECT_GRACE="+h.o.grace.String(),
		"JOBLIB_TASK_RETENTION_COMPLETED="+ret, "JOBLIB_TASK_RETENTION_FAILED="+ret,
	)
	h.cmd.Stdout, h.cmd.Stderr = logf, logf
	if err := h.cmd.Start(); err != nil {
		return fmt.Errorf("start %s serve: %w", h.o.bin, err)
	}
	h.exited = make(chan struct{})
	go func() { _ = h.cmd.Wait(); logf.Close(); close(h.exited) }()
	h.http = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 512}}
	deadline := time.Now().Add(60 * time.Second)
	for {
		res, err := h.http.Get(h.base + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				break
			}
		}
		select {
		case <-h.exited:
			log, _ := os.ReadFile(h.logPath)
			return fmt.Errorf("server exited at start:\n%s", log)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errors.New("server not ready within 60s")
		}
	}
	if h.db == nil {
		db, err := models.Open(ctx, h.dbURL, models.OpenOptions{})
		if err != nil {
			return fmt.Errorf("open the database for accounting: %w", err)
		}
		h.db = db
	}
	return nil
}

func (h *harness) killServer() {
	if h.cmd == nil || h.cmd.Process == nil {
		return
	}
	select {
	case <-h.exited:
	default:
		_ = h.cmd.Process.Kill()
		<-h.exited
	}
}

// call is one REST request; out (if not nil) receives the JSON answer.
func (h *harness) call(ctx context.Context, method, path string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, h.base+"/v1/joblib"+path, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+h.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := h.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	if out != nil && res.StatusCode < 300 {
		if err := json.NewDecoder(res.Body).Decode(out); err != nil {
			return res.StatusCode, fmt.Errorf("decode %s %s: %w", method, path, err)
		}
	} else {
		_, _ = io.Copy(io.Discard, res.Body)
	}
	return res.StatusCode, nil
}

const (
	jobRoom = "soak"
	jobName = "soak:modifiers:Echo"
)

func room(i int) string { return "room-" + strconv.Itoa(i) }

// ---- the run ----

func (h *harness) soak(ctx context.Context) error {
	o := h.o
	fmt.Fprintf(h.out, "soak: %s on %s for %s: %.0f tasks/s over %d rooms, %d socket + %d REST workers, %d UIs, churn every ~%s, retention %s, worker timeout %s\n",
		o.bin, o.db, o.duration, o.rate, o.rooms, o.socketWorkers, o.restWorkers, o.uis, o.churn, o.retention, o.workerTimeout)
	time.Sleep(2 * time.Second) // let start-up settle before the baseline
	base, err := h.sampleNow(ctx)
	if err != nil {
		return err
	}
	start := time.Now()
	h.printHeader()
	h.printSample(0, base)

	load, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	workers, stopWorkers := context.WithCancel(ctx)
	defer stopWorkers()

	var wg sync.WaitGroup
	pool := newPool[*restartable]()
	// Socket and REST workers, each in a slot that restarts it when churned.
	for i := range o.socketWorkers {
		s := &restartable{kind: "socket", id: i}
		pool.add(s)
		wg.Go(func() { h.slot(workers, s, h.socketWorker) })
	}
	for i := range o.restWorkers {
		s := &restartable{kind: "rest", id: i}
		pool.add(s)
		wg.Go(func() { h.slot(workers, s, h.restWorker) })
	}
	uis := newPool[*restartable]()
	var uiwg sync.WaitGroup
	for i := range o.uis {
		s := &restartable{kind: "ui", id: i}
		uis.add(s)
		uiwg.Go(func() { h.slot(workers, s, h.ui) })
	}
	// Submitter and churn run until the load ends.
	var lwg sync.WaitGroup
	lwg.Go(func() { h.submit(load) })
	lwg.Go(func() { h.churnLoop(load, pool, uis) })
	if h.pg != nil && o.vacuum > 0 {
		var av string
		if err := h.pg.QueryRow(ctx, "SHOW autovacuum").Scan(&av); err == nil && av == "off" {
			fmt.Fprintf(h.out, "autovacuum is off on this PostgreSQL: the harness runs VACUUM (ANALYZE) on the tables every %s\n", o.vacuum)
			lwg.Go(func() { h.vacuumLoop(load) })
		}
	}
	// Samples.
	lwg.Go(func() {
		t := time.NewTicker(o.sample)
		defer t.Stop()
		for {
			select {
			case <-load.Done():
				return
			case <-t.C:
				if s, err := h.sampleNow(ctx); err == nil {
					h.printSample(time.Since(start), s)
				} else {
					fmt.Fprintln(h.out, "sample:", err)
				}
			}
		}
	})
	select {
	case <-time.After(o.duration):
	case <-ctx.Done():
		return ctx.Err()
	case <-h.exited:
		return errors.New("the server exited during the load; see its log")
	}
	stopLoad()
	lwg.Wait()
	loadEnd := time.Since(start)

	// Final phase 1: the live workers drain what is pending.
	drainStart := time.Now()
	for time.Since(drainStart) < 60*time.Second {
		m, err := h.metrics(ctx)
		if err == nil && m[`joblib_tasks{status="pending"}`] == 0 {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	drained := time.Since(drainStart)
	// Final phase 2: every worker dies at once (no goodbye); the server
	// must clean them all (disconnect grace for sockets, the sweeper for
	// REST workers).
	pool.each(func(r *restartable) { r.kill(true) })
	stopWorkers()
	wg.Wait()
	cleanStart := time.Now()
	var clean time.Duration
	for {
		m, err := h.metrics(ctx)
		if err == nil && m["joblib_workers"] == 0 && m[`joblib_tasks{status="claimed"}`] == 0 && m[`joblib_tasks{status="running"}`] == 0 {
			clean = time.Since(cleanStart)
			break
		}
		if time.Since(cleanStart) > 3*o.workerTimeout+30*time.Second {
			clean = -1
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	uiwg.Wait()
	fin, err := h.sampleNow(ctx)
	if err != nil {
		return err
	}
	h.printSample(time.Since(start), fin)
	acc, err := h.account(ctx)
	if err != nil {
		return err
	}
	// Settle, then compare with the baseline (without this process's idle
	// keep-alive connections, which the server holds too).
	h.http.CloseIdleConnections()
	time.Sleep(5 * time.Second)
	after, err := h.sampleNow(ctx)
	if err != nil {
		return err
	}
	sigStart := time.Now()
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	var sigterm time.Duration
	select {
	case <-h.exited:
		sigterm = time.Since(sigStart)
	case <-time.After(40 * time.Second):
		sigterm = -1
	}
	h.report(loadEnd, drained, clean, base, after, acc, sigterm)
	if !acc.ok() || clean < 0 || h.uiDup.Load() != 0 {
		return errors.New("the accounting does not balance (see above)")
	}
	return nil
}

// ---- restartable clients and churn ----

// restartable is one client slot: run is restarted after each kill.
type restartable struct {
	kind string
	id   int

	mu     sync.Mutex
	cancel context.CancelCauseFunc
}

var (
	errKilled   = errors.New("killed")
	errSilent   = errors.New("silent")
	errGraceful = errors.New("graceful")
)

func (r *restartable) kill(hard bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancel != nil {
		if hard {
			r.cancel(errKilled)
		} else {
			r.cancel(errGraceful)
		}
	}
}

func (r *restartable) silence() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancel != nil {
		r.cancel(errSilent)
	}
}

type pool[T any] struct {
	mu    sync.Mutex
	items []T
}

func newPool[T any]() *pool[T] { return &pool[T]{} }
func (p *pool[T]) add(v T) {
	p.mu.Lock()
	p.items = append(p.items, v)
	p.mu.Unlock()
}
func (p *pool[T]) random() (T, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var zero T
	if len(p.items) == 0 {
		return zero, false
	}
	return p.items[rand.IntN(len(p.items))], true
}
func (p *pool[T]) each(fn func(T)) {
	p.mu.Lock()
	items := append([]T(nil), p.items...)
	p.mu.Unlock()
	for _, v := range items {
		fn(v)
	}
}

// slot runs fn again and again until ctx ends; each run gets a context the
// churn may cancel with a cause.
func (h *harness) slot(ctx context.Context, r *restartable, fn func(context.Context) error) {
	for ctx.Err() == nil {
		rctx, cancel := context.WithCancelCause(ctx)
		r.mu.Lock()
		r.cancel = cancel
		r.mu.Unlock()
		err := fn(rctx)
		cancel(nil)
		if err != nil && rctx.Err() == nil && ctx.Err() == nil {
			h.workerErrs.Add(1)
			if h.workerErrs.Load() <= 10 {
				fmt.Fprintf(os.Stderr, "%s %d: %v\n", r.kind, r.id, err)
			}
			time.Sleep(time.Second)
		}
	}
}

func (h *harness) churnLoop(ctx context.Context, workers, uis *pool[*restartable]) {
	for {
		d := time.Duration(rand.ExpFloat64() * float64(h.o.churn))
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
		r, ok := workers.random()
		if !ok {
			continue
		}
		switch x := rand.IntN(10); {
		case x < 2 && h.o.uis > 0:
			if u, ok := uis.random(); ok {
				h.uiReconnects.Add(1)
				u.kill(true)
			}
		case r.kind == "socket":
			h.kills.Add(1)
			r.kill(true)
		case x < 7:
			h.silenced.Add(1)
			r.silence()
		default:
			h.graceful.Add(1)
			r.kill(false)
		}
	}
}

// vacuumLoop stands in for autovacuum. It uses its own connection: the
// sampler owns h.pg.
func (h *harness) vacuumLoop(ctx context.Context) {
	conn, err := pgx.Connect(ctx, h.dbURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "vacuum:", err)
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	t := time.NewTicker(h.o.vacuum)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, tbl := range []string{"tasks", "workers", "worker_job_links", "jobs", "cleanup_events", "joblib_event_spill"} {
			if _, err := conn.Exec(ctx, "VACUUM (ANALYZE) "+tbl); err != nil && ctx.Err() == nil {
				fmt.Fprintln(os.Stderr, "vacuum", tbl+":", err)
			}
		}
	}
}

// ---- the submitter ----

func (h *harness) submit(ctx context.Context) {
	// The first worker registers the job; submissions before that would
	// answer 404.
	for ctx.Err() == nil {
		if code, err := h.call(ctx, "GET", "/rooms/"+jobRoom+"/jobs/"+jobName, nil, nil); err == nil && code == 200 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	tokens := make(chan struct{}, 64)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range tokens {
				i := rand.IntN(h.o.rooms)
				var t struct {
					ID string `json:"id"`
				}
				body := map[string]any{"payload": map[string]any{"angle": rand.IntN(360), "axis": []int{0, 0, 1}, "selection": []int{1, 2, 3, 4, 5, 6, 7, 8}}}
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
				code, err := h.call(rctx, "POST", "/rooms/"+room(i)+"/tasks/"+jobName, body, &t)
				cancel()
				h.mu.Lock()
				switch {
				case err != nil:
					h.uncertain++
				case code == http.StatusAccepted:
					h.submitted[t.ID] = true
				default:
					if h.submitErrs.Add(1) <= 5 {
						fmt.Fprintf(os.Stderr, "submission refused: %d\n", code)
					}
				}
				h.mu.Unlock()
			}
		})
	}
	every := time.Duration(float64(time.Second) / h.o.rate)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			close(tokens)
			wg.Wait()
			return
		case <-t.C:
			select {
			case tokens <- struct{}{}:
			default: // the server is slower than the rate; skip
			}
		}
	}
}

// ---- workers ----

// register creates a worker and links it to the soak job.
func (h *harness) register(ctx context.Context) (string, error) {
	var w struct {
		ID string `json:"id"`
	}
	if code, err := h.call(ctx, "POST", "/workers", nil, &w); err != nil || code != 201 {
		return "", fmt.Errorf("create worker: %d %v", code, err)
	}
	body := map[string]any{"category": "modifiers", "name": "Echo", "schema": map[string]any{}, "worker_id": w.ID}
	if code, err := h.call(ctx, "PUT", "/rooms/"+jobRoom+"/jobs", body, nil); err != nil || (code != 200 && code != 201) {
		return "", fmt.Errorf("register job: %d %v", code, err)
	}
	return w.ID, nil
}

// work claims until nothing is left, running each task for a short while.
// It returns when ctx ends (the task in hand is abandoned).
func (h *harness) work(ctx context.Context, wid string) error {
	for ctx.Err() == nil {
		var c struct {
			Task *struct {
				ID string `json:"id"`
			} `json:"task"`
		}
		code, err := h.call(ctx, "POST", "/tasks/claim", map[string]any{"worker_id": wid}, &c)
		if err != nil || code != 200 {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("claim: %d %v", code, err)
		}
		if c.Task == nil {
			return nil
		}
		h.claims.Add(1)
		id := c.Task.ID
		if _, err := h.call(ctx, "PATCH", "/tasks/"+id, map[string]any{"status": "running"}, nil); err != nil {
			h.abandoned.Add(1)
			return nil
		}
		select {
		case <-ctx.Done():
			h.abandoned.Add(1)
			return nil
		case <-time.After(time.Duration(20+rand.IntN(200)) * time.Millisecond):
		}
		status, errMsg := "completed", any(nil)
		if rand.IntN(20) == 0 {
			status, errMsg = "failed", "soak: simulated failure"
		}
		code, err = h.call(ctx, "PATCH", "/tasks/"+id, map[string]any{"status": status, "error": errMsg}, nil)
		if err != nil {
			h.abandoned.Add(1)
			return nil
		}
		if code == 200 {
			if status == "completed" {
				h.completed.Add(1)
			} else {
				h.failedByUs.Add(1)
			}
		}
	}
	return nil
}

// socketWorker is a worker bound to a Socket.IO connection: it claims when
// told a task is available (and every second, in case it missed one). A
// kill drops the connection without a word.
func (h *harness) socketWorker(ctx context.Context) error {
	wid, err := h.register(ctx)
	if err != nil {
		return err
	}
	avail := make(chan struct{}, 1)
	s, err := dialSIO(ctx, h.base, h.token, func(name string, _ json.RawMessage) {
		if name == "task_available" {
			select {
			case avail <- struct{}{}:
			default:
			}
		}
	})
	if err != nil {
		return err
	}
	defer s.close()
	if err := s.emitOK(ctx, "join_job_room", map[string]any{"job_name": jobName, "worker_id": wid}); err != nil {
		return err
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if err := h.work(ctx, wid); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.done:
			return errors.New("socket closed by the server")
		case <-avail:
		case <-tick.C:
		}
	}
}

// restWorker heartbeats and polls over REST only. Silenced, it stops without
// deleting itself (the sweeper must find it); gracefully, it deletes itself.
func (h *harness) restWorker(ctx context.Context) error {
	wid, err := h.register(ctx)
	if err != nil {
		return err
	}
	hb := time.NewTicker(2 * time.Second)
	defer hb.Stop()
	poll := time.NewTicker(200 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			if errors.Is(context.Cause(ctx), errGraceful) {
				dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				_, _ = h.call(dctx, "DELETE", "/workers/"+wid, nil, nil)
				cancel()
			}
			return nil
		case <-hb.C:
			code, err := h.call(ctx, "PATCH", "/workers/"+wid, nil, nil)
			if err == nil && code == 404 {
				h.reaped404.Add(1)
				return nil // reaped while alive: re-register
			}
		case <-poll.C:
			if err := h.work(ctx, wid); err != nil {
				return err
			}
		}
	}
}

// ---- UIs ----

var rank = map[string]int{"pending": 0, "claimed": 1, "running": 2, "completed": 3, "failed": 3, "cancelled": 3}

// ui joins two rooms and checks each task's status events on this
// connection: never the same status twice, never backwards.
func (h *harness) ui(ctx context.Context) error {
	var mu sync.Mutex
	seen := map[string]string{} // task id → the last status
	s, err := dialSIO(ctx, h.base, h.token, func(name string, arg json.RawMessage) {
		if name != "task_status_event" {
			return
		}
		var ev struct {
			ID     string `json:"id"`
			Status string `json:"status"`
		}
		if json.Unmarshal(arg, &ev) != nil {
			return
		}
		h.uiEvents.Add(1)
		mu.Lock()
		last, ok := seen[ev.ID]
		seen[ev.ID] = ev.Status
		mu.Unlock()
		switch {
		case ok && ev.Status == last:
			h.uiDup.Add(1)
		case ok && rank[ev.Status] < rank[last]:
			h.uiOrder.Add(1)
			h.orderMu.Lock()
			if h.orderBy == nil {
				h.orderBy = map[string]int{}
			}
			h.orderBy[last+"→"+ev.Status]++
			h.orderMu.Unlock()
		}
	})
	if err != nil {
		return err
	}
	defer s.close()
	i := rand.IntN(h.o.rooms)
	for _, rm := range []string{room(i), room((i + 1) % h.o.rooms)} {
		if err := s.emitOK(ctx, "join_room", map[string]any{"room_id": rm}); err != nil {
			return err
		}
	}
	select {
	case <-ctx.Done():
		return nil
	case <-s.done:
		return errors.New("UI socket closed by the server")
	}
}

// ---- the Socket.IO connections (internal/sio/sioclient) ----

type sioClient struct {
	c    *sioclient.Client
	done <-chan struct{} // closed when the connection has ended
}

// dialSIO connects to namespace / with the token and calls on for every
// server event with its first argument (on the reader goroutine; it must not
// block).
func dialSIO(ctx context.Context, base, token string, on func(name string, arg json.RawMessage)) (*sioClient, error) {
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	c, err := sioclient.Dial(dctx, base, sioclient.Options{
		Auth:      map[string]string{"token": token},
		ReadLimit: 8 << 20,
		OnEvent: func(ev sioclient.Event) {
			var arg json.RawMessage
			if len(ev.Args) > 0 {
				arg = ev.Args[0]
			}
			on(ev.Name, arg)
		},
	})
	if err != nil {
		return nil, err
	}
	return &sioClient{c: c, done: c.Done()}, nil
}

// emitOK sends an event with an ack and requires {"ok": true}.
func (s *sioClient) emitOK(ctx context.Context, name string, arg any) error {
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	a, err := s.c.Call(cctx, name, arg)
	if err != nil {
		return err
	}
	var r struct {
		OK     bool   `json:"ok"`
		Detail string `json:"detail"`
	}
	_ = a.Decode(&r)
	if !r.OK {
		return fmt.Errorf("%s refused: %s", name, r.Detail)
	}
	return nil
}

// close drops the connection without a Socket.IO DISCONNECT, like a killed
// process.
func (s *sioClient) close() {
	s.c.Kill()
	<-s.done
}

// ---- samples ----

type sample struct {
	rssMB      float64
	heapMB     float64
	goroutines float64
	fds        int
	sockets    float64
	workers    float64
	rows       float64
	pending    float64
	deleted    float64
	tableMB    float64
	spill      int64
	submitted  int
}

func (h *harness) metrics(ctx context.Context) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", h.base+"/metrics", nil)
	res, err := h.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	m := map[string]float64{}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			m[line[:i]] = v
		}
	}
	return m, sc.Err()
}

func sumPrefix(m map[string]float64, prefix string) float64 {
	var n float64
	for k, v := range m {
		if strings.HasPrefix(k, prefix) {
			n += v
		}
	}
	return n
}

func (h *harness) sampleNow(ctx context.Context) (sample, error) {
	var s sample
	m, err := h.metrics(ctx)
	if err != nil {
		return s, err
	}
	pid := h.cmd.Process.Pid
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, l := range strings.Split(string(st), "\n") {
			if strings.HasPrefix(l, "VmRSS:") {
				f := strings.Fields(l)
				kb, _ := strconv.ParseFloat(f[1], 64)
				s.rssMB = kb / 1024
			}
		}
	}
	if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
		s.fds = len(ents)
	}
	s.heapMB = m["go_memstats_heap_inuse_bytes"] / (1 << 20)
	s.goroutines = m["go_goroutines"]
	s.sockets = m["joblib_socket_connections"]
	s.workers = m["joblib_workers"]
	s.rows = sumPrefix(m, "joblib_tasks{")
	s.pending = m[`joblib_tasks{status="pending"}`]
	s.deleted = sumPrefix(m, "joblib_tasks_deleted_total{")
	if h.pg != nil {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var bytes int64
		if err := h.pg.QueryRow(qctx, "SELECT pg_total_relation_size('tasks')").Scan(&bytes); err == nil {
			s.tableMB = float64(bytes) / (1 << 20)
		}
		_ = h.pg.QueryRow(qctx, "SELECT count(*) FROM joblib_event_spill").Scan(&s.spill)
		cancel()
	} else {
		for _, suffix := range []string{"", "-wal"} {
			if fi, err := os.Stat(h.sqlite + suffix); err == nil {
				s.tableMB += float64(fi.Size()) / (1 << 20)
			}
		}
	}
	h.mu.Lock()
	s.submitted = len(h.submitted)
	h.mu.Unlock()
	return s, nil
}

func (h *harness) printHeader() {
	size := "tasks MB"
	if h.pg == nil {
		size = "db file MB"
	}
	fmt.Fprintf(h.out, "\n| t | RSS MB | heap MB | goroutines | fds | sockets | workers | submitted | task rows | pending | deleted | %s | spill rows |\n", size)
	fmt.Fprintln(h.out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
}

func (h *harness) printSample(t time.Duration, s sample) {
	fmt.Fprintf(h.out, "| %s | %.1f | %.1f | %.0f | %d | %.0f | %.0f | %d | %.0f | %.0f | %.0f | %.1f | %d |\n",
		t.Round(time.Second), s.rssMB, s.heapMB, s.goroutines, s.fds, s.sockets, s.workers, s.submitted, s.rows, s.pending, s.deleted, s.tableMB, s.spill)
}

// ---- final accounting ----

type accounting struct {
	submitted, uncertain     int
	inDB, unknown, dupRows   int
	deleted                  float64
	byStatus                 map[string]int
	heldByMissing, liveTasks int
	workersLeft              int
	disconnected             int
	balanced                 bool
}

func (a accounting) ok() bool {
	return a.balanced && a.dupRows == 0 && a.unknown <= a.uncertain && a.heldByMissing == 0 && a.liveTasks == 0 && a.workersLeft == 0
}

// account reads every task in one statement (one snapshot) and the deleted
// counter before and after; it retries while retention deleted in between.
func (h *harness) account(ctx context.Context) (accounting, error) {
	h.mu.Lock()
	submitted := make(map[string]bool, len(h.submitted))
	for k := range h.submitted {
		submitted[k] = true
	}
	uncertain := h.uncertain
	h.mu.Unlock()
	for attempt := 0; ; attempt++ {
		m0, err := h.metrics(ctx)
		if err != nil {
			return accounting{}, err
		}
		q := h.db.Q(ctx)
		ts, _, err := q.ListTasks(models.TaskFilter{}, models.Page{Limit: 1 << 30})
		if err != nil {
			return accounting{}, err
		}
		ws, _, err := q.ListWorkers(models.Page{Limit: 1 << 30})
		if err != nil {
			return accounting{}, err
		}
		m1, err := h.metrics(ctx)
		if err != nil {
			return accounting{}, err
		}
		d0, d1 := sumPrefix(m0, "joblib_tasks_deleted_total{"), sumPrefix(m1, "joblib_tasks_deleted_total{")
		if d0 != d1 && attempt < 10 {
			time.Sleep(300 * time.Millisecond)
			continue
		}
		a := accounting{submitted: len(submitted), uncertain: uncertain, deleted: d0, byStatus: map[string]int{}, workersLeft: len(ws)}
		live := map[uuid.UUID]bool{}
		for _, w := range ws {
			live[w.ID] = true
		}
		seen := map[uuid.UUID]bool{}
		for _, t := range ts {
			if seen[t.ID] {
				a.dupRows++
			}
			seen[t.ID] = true
			a.inDB++
			a.byStatus[t.Status]++
			if !submitted[t.ID.String()] {
				a.unknown++
			}
			if t.Status == models.StatusClaimed || t.Status == models.StatusRunning {
				a.liveTasks++
				if t.WorkerID == nil || !live[*t.WorkerID] {
					a.heldByMissing++
				}
			}
			if t.Error != nil && *t.Error == "Worker disconnected" {
				a.disconnected++
			}
		}
		// Every submitted task is in the database or was deleted by
		// retention; tasks whose submission answer was lost may be either.
		a.balanced = a.inDB-a.unknown+int(a.deleted) >= a.submitted && a.inDB+int(a.deleted) <= a.submitted+a.uncertain
		return a, nil
	}
}

func (h *harness) report(load, drained, clean time.Duration, base, after sample, a accounting, sigterm time.Duration) {
	w := h.out
	fmt.Fprintf(w, "\nload %s; drained pending in %s; all workers killed at once, server clean (0 workers, 0 claimed/running) after %s\n",
		load.Round(time.Second), drained.Round(100*time.Millisecond), fmtDur(clean))
	fmt.Fprintf(w, "clients: %d task claims, %d completed and %d failed by workers, %d abandoned by killed workers; churn: %d socket kills, %d REST workers silenced, %d graceful leaves, %d UI reconnects; %d live REST workers reaped (false positives); %d client errors\n",
		h.claims.Load(), h.completed.Load(), h.failedByUs.Load(), h.abandoned.Load(), h.kills.Load(), h.silenced.Load(), h.graceful.Load(),
		h.uiReconnects.Load(), h.reaped404.Load(), h.workerErrs.Load())
	fmt.Fprintf(w, "accounting: %d submitted (+%d with a lost answer, %d refused); in the database %d %v + deleted by retention %.0f = %.0f; unknown rows %d, duplicate rows %d; claimed/running left %d, held by a missing worker %d; workers left %d; failed \"Worker disconnected\" %d in the database\n",
		a.submitted, a.uncertain, h.submitErrs.Load(), a.inDB, a.byStatus, a.deleted, float64(a.inDB)+a.deleted, a.unknown, a.dupRows, a.liveTasks, a.heldByMissing, a.workersLeft, a.disconnected)
	h.orderMu.Lock()
	fmt.Fprintf(w, "UI events: %d task_status_event received, %d duplicated, %d out of order %v\n", h.uiEvents.Load(), h.uiDup.Load(), h.uiOrder.Load(), h.orderBy)
	h.orderMu.Unlock()
	fmt.Fprintf(w, "resources after the load vs baseline: RSS %.1f → %.1f MB (×%.2f), heap %.1f → %.1f MB (×%.2f), goroutines %.0f → %.0f, fds %d → %d, sockets %.0f → %.0f\n",
		base.rssMB, after.rssMB, after.rssMB/base.rssMB, base.heapMB, after.heapMB, after.heapMB/base.heapMB, base.goroutines, after.goroutines, base.fds, after.fds, base.sockets, after.sockets)
	fmt.Fprintf(w, "SIGTERM → exit in %s\n", fmtDur(sigterm))
	if log, err := os.ReadFile(h.logPath); err == nil {
		errs := bytes.Count(log, []byte(`"level":"ERROR"`))
		fmt.Fprintf(w, "server log: %d lines, %d at ERROR\n", bytes.Count(log, []byte("\n")), errs)
		msgs := map[string]int{}
		first := map[string]string{}
		for _, l := range bytes.Split(log, []byte("\n")) {
			var e struct{ Level, Msg string }
			if json.Unmarshal(l, &e) == nil && (e.Level == "ERROR" || e.Level == "WARN") {
				k := e.Level + " " + e.Msg
				if msgs[k]++; msgs[k] == 1 {
					first[k] = string(l[:min(len(l), 600)])
				}
			}
		}
		for m, n := range msgs {
			fmt.Fprintf(w, "  %d× %s; first: %s\n", n, m, first[m])
		}
	}
	verdict := "BALANCED"
	if !a.ok() || clean < 0 || h.uiDup.Load() != 0 {
		verdict = "NOT BALANCED"
	}
	if h.uiOrder.Load() != 0 {
		verdict += " (events out of order on a connection: see UI events)"
	}
	fmt.Fprintln(w, "verdict:", verdict)
}

func fmtDur(d time.Duration) string {
	if d < 0 {
		return "never (timed out)"
	}
	return d.Round(10 * time.Millisecond).String()
}
