// Command claim measures the claim path against the machine's own ceiling.
//
// In one run it alternates rounds of two systems on the same PostgreSQL:
//
//   - joblib over HTTP (an in-process server on loopback), with a normal
//     user's token and the contract's three requests per task: claim, then
//     PATCH running, then PATCH completed (or, with -batch N > 1, one
//     claim-batch request for up to N tasks and the same two PATCHes per task;
//     -flow batch reports each batch's statuses with one update-batch request,
//     -flow socket claims and reports over each worker's socket with
//     claim_tasks and update_tasks, and -start claims tasks running);
//   - the raw loop: one `UPDATE … FOR UPDATE SKIP LOCKED RETURNING` claim and
//     one completing UPDATE per task, autocommit, over pgx.
//
// With -floor a third system runs too: the same three HTTP requests per
// task to a server that runs only the raw loop's statements, the most any
// server speaking the contract over HTTP could reach here.
//
// W workers loop until the round's queue is empty. It prints, per system,
// the median over rounds of tasks/s, the claim p50/p99 over every claim,
// statements per task and CPU per task (this process; the PostgreSQL
// backends serving the system, told apart by application_name and read from
// /proc; the whole machine), then the ratio joblib/raw. -bus pg adds the NOTIFY
// that serve sends to other nodes; -raw-notify puts one in each raw statement;
// -raw-shape runs the raw loop on a table shaped like joblib's tasks, with
// two changes per task or the contract's three, which tells the cost of the
// table and its changes from the cost of joblib's statements.
//
// On PostgreSQL more lines compare the database's work per task (the
// buffers and WAL lines need pg_stat_statements; the machine's load does
// not move them, which makes them the figures to compare across runs):
// "postgres backend cpu/task" is the utime+stime (from /proc/<pid>/stat,
// read before and after each round) of every backend serving the system's
// connections (joblib: its statements, the outbox relay and the LISTEN
// connection of every node; the raw loop: its pool), for joblib and the raw
// loop and their ratio. PostgreSQL's own processes (WAL writer,
// checkpointer, background writer, autovacuum) are not in it: they serve
// every client of the server, other sessions included, and are printed
// apart as "auxiliary processes", the CPU they used while that system's
// rounds ran. -nodes N runs joblib as N nodes on the one database (each its
// own pool, event bus, relay and HTTP server); worker i and submitter i use
// node i mod N.
//
//	go run ./bench/claim -db postgres://postgres@127.0.0.1:5432/test -workers 8 -tasks 2000 -rounds 3
//	go run ./bench/claim -workers 8 -tasks 2000        # SQLite in a temp dir (joblib only)
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
)

type options struct {
	priorities             int
	db                     string
	workers, tasks, rounds int
	batch                  int
	cpuprofile             string
	perfCtl                string
	bus                    string
	rawNotify              bool
	rawShape               string
	notifyAfterCommit      bool
	groupDelay             time.Duration
	homeRouting            bool
	setupSQL               string
	params                 string
	floor                  bool
	nodes                  int
	users                  int
	flow                   string
	start                  bool
	progressRate           int
	warmup                 bool
}

func main() {
	var o options
	flag.StringVar(&o.db, "db", "", "postgres:// URL (a private schema is created and dropped); empty = SQLite in a temp dir, joblib only")
	flag.IntVar(&o.workers, "workers", 8, "concurrent workers")
	flag.IntVar(&o.users, "users", 1, "joblib: normal users the workers belong to (worker i is user i mod N's), as a fleet of many users runs")
	flag.IntVar(&o.tasks, "tasks", 2000, "tasks per round")
	flag.IntVar(&o.rounds, "rounds", 3, "rounds of each system, interleaved")
	flag.IntVar(&o.batch, "batch", 1, "tasks per joblib claim: 1 uses POST /tasks/claim, more uses POST /tasks/claim-batch")
	flag.StringVar(&o.bus, "bus", "local", "PostgreSQL event bus: local (in-process, one node) or pg (NOTIFY to other nodes, as serve runs on PostgreSQL)")
	flag.BoolVar(&o.notifyAfterCommit, "notify-after-commit", false, "with -bus pg: NOTIFY other nodes after each commit (JOBLIB_NOTIFY_AFTER_COMMIT)")
	flag.BoolVar(&o.homeRouting, "home-routing", true, "with -nodes: each node holds a lease with its address and forwards claims and reports to the user's home node (JOBLIB_HOME_ROUTING)")
	flag.DurationVar(&o.groupDelay, "group-commit-delay", joblib.DefaultSettings().GroupCommitDelay, "how long a lone claim or report waits for company while its user is busy (JOBLIB_GROUP_COMMIT_DELAY)")
	flag.BoolVar(&o.rawNotify, "raw-notify", false, "the raw loop also sends a pg_notify inside each of its statements")
	flag.StringVar(&o.rawShape, "raw-shape", "narrow", "the raw loop's table and changes: narrow (the least a task table needs, two changes per task), tasks (joblib's task columns and indexes, two changes), tasks3 (joblib's table and the contract's three changes: claimed, running, completed), tasks3hot (tasks3 with a running change that touches no indexed column, fillfactor 80, so that PostgreSQL makes it a HOT update) or state3 (the contract's three changes on a narrow row with only the partial indexes joblib looks tasks up by: the bound of a task table split in two)")
	flag.StringVar(&o.setupSQL, "setup-sql", "", "SQL run on joblib's schema after the migrations (experiments: an index or trigger less)")
	flag.StringVar(&o.params, "params", "", "extra connection parameters for joblib's pool (experiments: plan_cache_mode=force_generic_plan)")
	flag.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of the joblib rounds to this file")
	flag.StringVar(&o.perfCtl, "perf-ctl", "", "a perf control FIFO (perf record -D -1 --control fifo:PATH): sampling is enabled during each joblib work loop only, so a system-wide profile leaves out submissions and the other systems")
	flag.StringVar(&o.flow, "flow", "contract", "how joblib's workers report: contract (PATCH running and PATCH completed per task), batch (POST /tasks/update-batch per claimed batch and status), socket (claim_tasks and update_tasks over each worker's Socket.IO connection, no HTTP)")
	flag.BoolVar(&o.start, "start", false, "with -flow batch or socket: claims start the tasks (running at once), so workers report only completed")
	flag.IntVar(&o.progressRate, "progress-rate", 0, "joblib: another worker reports this many task progresses per second (PATCH {\"progress\"}) on 100 tasks it holds while the workers claim and report")
	flag.IntVar(&o.nodes, "nodes", 1, "PostgreSQL: joblib nodes on the one database, each with its own pool, event bus, relay and HTTP server; worker i and submitter i use node i mod N")
	flag.IntVar(&o.priorities, "priorities", 0, "joblib: submit the tasks in this many priorities (0..n-1, mixed), so that claims take them by priority")
	flag.BoolVar(&o.warmup, "warmup", false, "first run one round of each system that is not measured: each new connection plans a hot statement anew for its first executions (the claim's plan costs about 3 ms, six times per connection), a cost a running server has paid long ago")
	flag.BoolVar(&o.floor, "floor", false, "PostgreSQL: also run the HTTP floor, the contract's three requests per task to a server that runs only the raw loop's statements")
	flag.Parse()
	if err := run(context.Background(), o); err != nil {
		log.Print(err)
		os.Exit(1)
	}
}

// result is one round of one system.
type result struct {
	elapsed time.Duration
	// proc is this process's CPU time (server and HTTP client for joblib,
	// the pgx client for the raw loop), machine the whole machine's busy
	// CPU time (PostgreSQL's backends included, and any other load).
	proc, machine time.Duration
	// pg is the CPU time of the PostgreSQL backends serving this system
	// (every connection of its pools: statements, the relay, the LISTEN
	// connection); aux that of PostgreSQL's own processes (WAL writer,
	// checkpointer, background writer, autovacuum) while the round ran,
	// which serve whatever else uses the server too.
	pg, aux time.Duration
	// work is what the statements of the round did (pg_stat_statements:
	// buffers hit or read, WAL written), unknown without that extension:
	// counts of the database's work that the machine's noise does not move.
	work       dbWork
	claims     []time.Duration
	statements int64
	tasks      int
}

func run(ctx context.Context, o options) error {
	if _, ok := rawShapes[o.rawShape]; !ok {
		return fmt.Errorf("-raw-shape %q: want narrow, tasks, tasks3, tasks3hot or state3", o.rawShape)
	}
	switch o.flow {
	case "contract", "batch", "socket":
	default:
		return fmt.Errorf("-flow %q: want contract, batch or socket", o.flow)
	}
	if o.nodes < 1 || (o.nodes > 1 && o.db == "") {
		return fmt.Errorf("-nodes %d: want 1, or more on PostgreSQL (-db)", o.nodes)
	}
	if o.users < 1 || o.users > o.workers {
		return fmt.Errorf("-users %d: want 1 to -workers (%d)", o.users, o.workers)
	}
	if o.start && o.flow == "contract" {
		return fmt.Errorf("-start needs -flow batch or socket (the contract's claim has no start)")
	}
	url, cleanup, err := prepare(ctx, o.db)
	if err != nil {
		return err
	}
	defer cleanup()
	var statements atomic.Int64
	jurl, rurl, furl := url, url, url
	if o.db != "" {
		// Each system's backends carry their own application_name, so the
		// bench can read their CPU time from /proc.
		tag := fmt.Sprintf("claimbench%d", os.Getpid())
		jurl, rurl, furl = url+"&application_name="+tag+"j", url+"&application_name="+tag+"r", url+"&application_name="+tag+"f"
		if o.params != "" {
			jurl += "&" + o.params
		}
		if backends, err = pgx.Connect(ctx, o.db); err != nil {
			return err
		}
		defer backends.Close(ctx)
	}
	db, err := models.Open(ctx, jurl, models.OpenOptions{MaxConns: 32, Statements: &statements})
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.Migrate(ctx); err != nil {
		return err
	}
	if o.setupSQL != "" {
		if _, err := db.Pool.Exec(ctx, o.setupSQL); err != nil {
			return fmt.Errorf("setup-sql: %w", err)
		}
	}
	jb, err := newJoblibBench(ctx, db, jurl, &statements, o)
	if err != nil {
		return err
	}
	defer jb.close()
	var rb *rawBench
	if db.Dialect() == models.Postgres {
		if rb, err = newRawBench(ctx, rurl, o); err != nil {
			return err
		}
		defer rb.close()
	}
	var fb *floorBench
	if rb != nil && o.floor {
		if fb, err = newFloorBench(ctx, furl, o); err != nil {
			return err
		}
		defer fb.close()
	}
	if o.cpuprofile != "" {
		if jb.prof, err = os.Create(o.cpuprofile); err != nil {
			return err
		}
		defer jb.prof.Close()
	}
	if o.warmup {
		prof := jb.prof
		jb.prof = nil // the profile is of a measured round
		_, err := jb.round(ctx)
		jb.prof = prof
		if err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
		if rb != nil {
			if _, err := rb.round(ctx); err != nil {
				return fmt.Errorf("warm-up: %w", err)
			}
		}
		if fb != nil {
			if _, err := fb.round(ctx); err != nil {
				return fmt.Errorf("warm-up: %w", err)
			}
		}
	}
	var jrs, rrs, frs []result
	for range o.rounds {
		jr, err := jb.round(ctx)
		if err != nil {
			return err
		}
		jrs = append(jrs, jr)
		if rb != nil {
			rr, err := rb.round(ctx)
			if err != nil {
				return err
			}
			rrs = append(rrs, rr)
		}
		if fb != nil {
			fr, err := fb.round(ctx)
			if err != nil {
				return err
			}
			frs = append(frs, fr)
		}
	}
	label := "joblib"
	if o.flow != "contract" {
		label += "-" + o.flow
	}
	if o.start {
		label += "-start"
	}
	if o.batch > 1 {
		label += fmt.Sprintf("-batch%d", o.batch)
	}
	if o.progressRate > 0 {
		label += fmt.Sprintf("-progress%d", o.progressRate)
	}
	if o.nodes > 1 {
		label += fmt.Sprintf("-nodes%d", o.nodes)
	}
	fmt.Printf("database=%s workers=%d users=%d tasks/round=%d rounds=%d nodes=%d warmup=%t\n", db.Dialect(), o.workers, o.users, o.tasks, o.rounds, o.nodes, o.warmup)
	jt := summary(label, jrs, db.Dialect() == models.Postgres)
	if rb != nil {
		name := "raw"
		if o.rawShape != "narrow" {
			name += "(" + o.rawShape + ")"
		}
		if o.rawNotify {
			name += "+notify"
		}
		rt := summary(name, rrs, true)
		jpg, jaux := pgPerTask(jrs)
		rpg, raux := pgPerTask(rrs)
		fmt.Printf("postgres backend cpu/task: joblib=%.0fµs raw=%.0fµs ratio=%.2f (per round:", jpg, rpg, jpg/rpg)
		for i := range jrs {
			fmt.Printf(" %.2f", pgRatio(jrs[i], rrs[i]))
		}
		fmt.Printf(") auxiliary processes/task: joblib=%.0fµs raw=%.0fµs\n", jaux, raux)
		jb, jw, jwb, jok := workPerTask(jrs)
		rb, rw, rwb, rok := workPerTask(rrs)
		if jok && rok && rb > 0 && rw > 0 {
			fmt.Printf("postgres buffer accesses/task (pg_stat_statements): joblib=%.1f raw=%.1f ratio=%.2f\n", jb, rb, jb/rb)
			fmt.Printf("postgres WAL/task (pg_stat_statements): records joblib=%.1f raw=%.1f ratio=%.2f, bytes joblib=%.0f raw=%.0f ratio=%.2f\n", jw, rw, jw/rw, jwb, rwb, jwb/rwb)
		}
		fmt.Printf("ratio joblib/raw=%.2f (per round:", jt/rt)
		for i := range jrs {
			fmt.Printf(" %.2f", rate(jrs[i])/rate(rrs[i]))
		}
		fmt.Println(")")
		if fb != nil {
			ft := summary("http-floor", frs, true)
			fmt.Printf("ratio http-floor/raw=%.2f (per round:", ft/rt)
			for i := range frs {
				fmt.Printf(" %.2f", rate(frs[i])/rate(rrs[i]))
			}
			fmt.Printf(") joblib/http-floor=%.2f\n", jt/ft)
		}
	}
	return nil
}

func rate(r result) float64 { return float64(r.tasks) / r.elapsed.Seconds() }

// pgPerTask is the PostgreSQL CPU per task over rounds, in µs: of the
// system's backends, and of the server's auxiliary processes.
func pgPerTask(rs []result) (backends, aux float64) {
	var pg, ax time.Duration
	var tasks int
	for _, r := range rs {
		pg, ax, tasks = pg+r.pg, ax+r.aux, tasks+r.tasks
	}
	return float64(pg.Microseconds()) / float64(tasks), float64(ax.Microseconds()) / float64(tasks)
}

// workPerTask is the database's work per task over rounds (see dbWork);
// ok is false when a round could not count it.
func workPerTask(rs []result) (blocks, walRecords, walBytes float64, ok bool) {
	var w dbWork
	var tasks int
	for _, r := range rs {
		if r.work.blocks < 0 {
			return 0, 0, 0, false
		}
		w.blocks, w.walRecords, w.walBytes = w.blocks+r.work.blocks, w.walRecords+r.work.walRecords, w.walBytes+r.work.walBytes
		tasks += r.tasks
	}
	if tasks == 0 {
		return 0, 0, 0, false
	}
	n := float64(tasks)
	return float64(w.blocks) / n, float64(w.walRecords) / n, float64(w.walBytes) / n, true
}

func pgRatio(a, b result) float64 {
	return (float64(a.pg) / float64(a.tasks)) / (float64(b.pg) / float64(b.tasks))
}

// summary prints one system's line and returns its median tasks/s.
func summary(name string, rs []result, counted bool) float64 {
	var rates []float64
	var claims []time.Duration
	var stmts int64
	var tasks int
	var proc, machine, pg time.Duration
	for _, r := range rs {
		pg += r.pg
		proc += r.proc
		machine += r.machine
		rates = append(rates, rate(r))
		claims = append(claims, r.claims...)
		stmts += r.statements
		tasks += r.tasks
	}
	slices.Sort(rates)
	slices.Sort(claims)
	med := rates[len(rates)/2]
	per := "n/a"
	if counted {
		per = fmt.Sprintf("%.1f", float64(stmts)/float64(tasks))
	}
	fmt.Printf("%-14s tasks/s=%6.0f (rounds:", name, med)
	for _, r := range rs {
		fmt.Printf(" %.0f", rate(r))
	}
	fmt.Printf(") claim_p50=%s claim_p99=%s statements/task=%s cpu/task: process=%.0fµs postgres=%.0fµs machine=%.0fµs\n", pct(claims, 0.50), pct(claims, 0.99), per,
		float64(proc.Microseconds())/float64(tasks), float64(pg.Microseconds())/float64(tasks), float64(machine.Microseconds())/float64(tasks))
	return med
}

func pct(s []time.Duration, p float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)-1, int(float64(len(s))*p))].Round(10 * time.Microsecond)
}

// joblibBench drives in-process joblib servers (one per -nodes) over HTTP.
type joblibBench struct {
	o     options
	nodes []*benchNode
	// c is node 0's client, cs[i] worker i's (its node's).
	c          *client
	cs         []*client
	wids       []string
	socks      []*benchSocket // -flow socket: one per worker
	statements *atomic.Int64
	// held are the tasks -progress-rate reports progress on.
	held []string
	// prof, when set, receives a CPU profile of the first round's timed
	// phase (claims and updates, not the submissions that fill the queue).
	prof *os.File
}

// benchNode is one joblib node: its pool, service, event bus and HTTP server.
type benchNode struct {
	db    *models.DB // nil for node 0, whose database run closes
	svc   *joblib.Service
	srv   *httptest.Server
	rt    *server.Realtime
	c     *client
	lease *joblib.Lease // as serve holds one: where other nodes reach this one
}

func newJoblibBench(ctx context.Context, db *models.DB, url string, statements *atomic.Int64, o options) (*joblibBench, error) {
	b := &joblibBench{o: o, statements: statements}
	token := ""
	for i := range o.nodes {
		ndb := db
		if i > 0 {
			var err error
			if ndb, err = models.Open(ctx, url, models.OpenOptions{MaxConns: 32, Statements: statements}); err != nil {
				b.close()
				return nil, err
			}
		}
		n, err := newBenchNode(ctx, ndb, i, &token, o)
		if i > 0 {
			n.db = ndb
		}
		if err != nil {
			if i > 0 {
				ndb.Close()
			}
			b.close()
			return nil, err
		}
		b.nodes = append(b.nodes, n)
	}
	b.c = b.nodes[0].c
	// User 0 is node 0's token, which also submits; -users adds others,
	// worker w belonging to user w mod users.
	tokens := []string{token}
	for u := 1; u < o.users; u++ {
		t, _, err := b.nodes[0].svc.CreateToken(ctx, fmt.Sprintf("bench%d", u), false)
		if err != nil {
			b.close()
			return nil, err
		}
		tokens = append(tokens, t)
	}
	for w := range o.workers {
		n := b.nodes[w%len(b.nodes)]
		c := *n.c
		c.token = tokens[w%len(tokens)]
		b.cs = append(b.cs, &c)
		var job map[string]any
		if err := c.do("PUT", "/rooms/bench/jobs", map[string]any{"category": "modifiers", "name": "Bench"}, &job); err != nil {
			b.close()
			return nil, err
		}
		b.wids = append(b.wids, job["worker_id"].(string))
		if o.flow == "socket" {
			so, err := dialBenchSocket(ctx, n.srv.URL, c.token)
			if err != nil {
				b.close()
				return nil, err
			}
			b.socks = append(b.socks, so)
		}
	}
	if o.progressRate > 0 {
		if err := b.holdTasks(); err != nil {
			b.close()
			return nil, err
		}
	}
	return b, nil
}

// newBenchNode starts node i on db; node 0 creates the normal user's token
// (*token), which every node then uses.
func newBenchNode(ctx context.Context, db *models.DB, i int, token *string, o options) (*benchNode, error) {
	cfg := joblib.Config{DB: db, Settings: joblib.DefaultSettings()}
	// Submissions fill the queue before each timed phase: no rate limit.
	cfg.Settings.SubmitRate = 0
	cfg.Settings.NotifyAfterCommit = o.notifyAfterCommit
	cfg.Settings.GroupCommitDelay = o.groupDelay
	if db.Dialect() == models.Postgres && o.bus == "pg" {
		// As deployed: events reach other nodes by NOTIFY.
		bus := events.NewPGBus(db.Pool, fmt.Sprintf("bench%d", i), nil)
		if err := bus.Start(ctx); err != nil {
			return nil, err
		}
		cfg.Bus = bus
	}
	svc := joblib.New(cfg)
	if *token == "" {
		// A normal user: the contract's owner checks run on every request.
		t, _, err := svc.CreateToken(ctx, "bench", false)
		if err != nil {
			svc.Close()
			return nil, err
		}
		*token = t
	}
	scfg := server.DefaultConfig()
	scfg.HomeRouting = o.homeRouting
	api := server.New(svc, scfg, nil)
	rt := api.NewRealtime(server.DefaultRealtimeConfig(), nil)
	api.Handle("/socket.io/", rt)
	if err := rt.Start(ctx); err != nil {
		svc.Close()
		return nil, err
	}
	srv := httptest.NewServer(api.Handler())
	// As serve runs: a lease that names where other nodes reach this one.
	lease := svc.NewLease(joblib.LeaseConfig{Addr: strings.TrimPrefix(srv.URL, "http://")})
	if err := lease.Start(ctx); err != nil {
		srv.Close()
		svc.Close()
		return nil, err
	}
	c := &client{base: srv.URL + "/v1/joblib", token: *token, http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.workers * 2}}}
	return &benchNode{svc: svc, srv: srv, rt: rt, c: c, lease: lease}, nil
}

// holdTasks makes another worker hold 100 running tasks of its own job, for
// -progress-rate to report on.
func (b *joblibBench) holdTasks() error {
	var job map[string]any
	if err := b.c.do("PUT", "/rooms/bench/jobs", map[string]any{"category": "modifiers", "name": "Hold"}, &job); err != nil {
		return err
	}
	for i := range 100 {
		if err := b.c.do("POST", "/rooms/bench/tasks/bench:modifiers:Hold", map[string]any{"payload": map[string]any{"i": i}}, nil); err != nil {
			return err
		}
	}
	var out struct {
		Tasks []struct {
			ID string `json:"id"`
		} `json:"tasks"`
	}
	if err := b.c.do("POST", "/tasks/claim-batch", map[string]any{"worker_id": job["worker_id"], "limit": 100, "start": true}, &out); err != nil {
		return err
	}
	for _, t := range out.Tasks {
		b.held = append(b.held, t.ID)
	}
	return nil
}

// reportProgress sends -progress-rate progress reports per second, spread
// over the held tasks, until stop is closed; it returns how many it sent.
func (b *joblibBench) reportProgress(stop <-chan struct{}) func() (int64, error) {
	// Enough senders that each waits 50 ms between reports: a report's
	// latency under load does not cap the rate.
	senders := max(8, b.o.progressRate/20)
	var sent atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	every := time.Second * time.Duration(senders) / time.Duration(b.o.progressRate)
	for s := range senders {
		wg.Go(func() {
			tick := time.NewTicker(every)
			defer tick.Stop()
			for i := s; ; i += senders {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				id := b.held[i%len(b.held)]
				if err := b.c.do("PATCH", "/tasks/"+id, map[string]any{"progress": map[string]any{"current": i, "total": 1 << 30, "message": "bench"}}, nil); err != nil {
					failed.Store(err)
					return
				}
				sent.Add(1)
			}
		})
	}
	return func() (int64, error) {
		wg.Wait()
		err, _ := failed.Load().(error)
		return sent.Load(), err
	}
}

func (b *joblibBench) close() {
	for _, so := range b.socks {
		so.close()
	}
	for _, n := range b.nodes {
		n.close()
	}
}

func (n *benchNode) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n.rt.Shutdown(ctx); err != nil {
		log.Printf("shutdown realtime: %v", err)
	}
	n.lease.Stop()
	n.srv.Close()
	n.svc.Close()
	if pb, ok := n.svc.Bus().(*events.PGBus); ok {
		pb.Stop()
	}
	if n.db != nil {
		n.db.Close()
	}
}

func (b *joblibBench) round(ctx context.Context) (result, error) {
	var wg sync.WaitGroup
	const submitters = 8
	var failed atomic.Value
	for s := range submitters {
		wg.Go(func() {
			c := b.nodes[s%len(b.nodes)].c
			for i := s; i < b.o.tasks; i += submitters {
				body := map[string]any{"payload": map[string]any{"i": i}}
				if b.o.priorities > 0 {
					body["priority"] = i % b.o.priorities
				}
				if err := c.do("POST", "/rooms/bench/tasks/bench:modifiers:Bench", body, nil); err != nil {
					failed.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		return result{}, err
	}
	if b.prof != nil {
		if err := pprof.StartCPUProfile(b.prof); err != nil {
			return result{}, err
		}
	}
	if err := perfControl(b.o.perfCtl, "enable"); err != nil {
		return result{}, err
	}
	s0 := b.statements.Load()
	c0, p0, a0, k0 := sampleCPU(), backendCPU(ctx, "j"), auxCPU(ctx), workCounters(ctx)
	start := time.Now()
	var progressDone func() (int64, error)
	stopProgress := make(chan struct{})
	if b.o.progressRate > 0 {
		progressDone = b.reportProgress(stopProgress)
	}
	claims, tasks, err := workLoop(b.o.workers, b.claim, b.report)
	r := result{elapsed: time.Since(start), claims: claims, statements: b.statements.Load() - s0, tasks: tasks}
	close(stopProgress)
	if progressDone != nil {
		n, perr := progressDone()
		if perr != nil && err == nil {
			err = fmt.Errorf("progress report: %w", perr)
		}
		fmt.Printf("  progress reports: %d (%.0f/s)\n", n, float64(n)/r.elapsed.Seconds())
	}
	r.proc, r.machine = sampleCPU().since(c0)
	r.pg, r.aux, r.work = backendCPU(ctx, "j").since(p0), auxCPU(ctx).since(a0), workSince(ctx, k0)
	if perr := perfControl(b.o.perfCtl, "disable"); perr != nil && err == nil {
		err = perr
	}
	if b.prof != nil {
		pprof.StopCPUProfile()
		b.prof = nil
	}
	if err != nil {
		return result{}, err
	}
	if r.tasks != b.o.tasks {
		return result{}, fmt.Errorf("joblib processed %d tasks, want %d", r.tasks, b.o.tasks)
	}
	return r, nil
}

// workLoop runs workers concurrent workers until claim finds nothing: claim,
// then report running and completed for the claimed tasks. It returns every
// claim's latency and the tasks done.
func workLoop(workers int, claim func(w int) ([]string, error), report func(w int, ids []string, status string) error) ([]time.Duration, int, error) {
	lat := make([][]time.Duration, workers)
	done := make([]int, workers)
	var failed atomic.Value
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for {
				t0 := time.Now()
				ids, err := claim(w)
				if err != nil {
					failed.Store(err)
					return
				}
				if len(ids) == 0 {
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
				for _, st := range []string{"running", "completed"} {
					if err := report(w, ids, st); err != nil {
						failed.Store(err)
						return
					}
				}
				done[w] += len(ids)
			}
		})
	}
	wg.Wait()
	n := 0
	for _, d := range done {
		n += d
	}
	err, _ := failed.Load().(error)
	return slices.Concat(lat...), n, err
}

// patchEach is the contract's report: one PATCH per task and status.
func patchEach(c *client) func(int, []string, string) error {
	return func(_ int, ids []string, status string) error {
		for _, id := range ids {
			if err := c.do("PATCH", "/tasks/"+id, map[string]any{"status": status}, nil); err != nil {
				return err
			}
		}
		return nil
	}
}

func (b *joblibBench) claim(w int) ([]string, error) {
	type task struct {
		ID string `json:"id"`
	}
	ids := func(ts []task) []string {
		out := make([]string, len(ts))
		for i, t := range ts {
			out[i] = t.ID
		}
		return out
	}
	var out struct {
		Tasks []task `json:"tasks"`
		Task  *task  `json:"task"`
	}
	switch {
	case b.o.flow == "socket":
		if err := b.socks[w].call("claim_tasks", map[string]any{"worker_id": b.wids[w], "limit": b.o.batch, "start": b.o.start}, &out); err != nil {
			return nil, err
		}
		return ids(out.Tasks), nil
	case b.o.batch > 1 || b.o.flow != "contract":
		if err := b.cs[w].do("POST", "/tasks/claim-batch", map[string]any{"worker_id": b.wids[w], "limit": b.o.batch, "start": b.o.start}, &out); err != nil {
			return nil, err
		}
		return ids(out.Tasks), nil
	}
	if err := b.cs[w].do("POST", "/tasks/claim", map[string]any{"worker_id": b.wids[w]}, &out); err != nil {
		return nil, err
	}
	if out.Task == nil {
		return nil, nil
	}
	return []string{out.Task.ID}, nil
}

// report tells joblib the claimed tasks' new status, as -flow says.
func (b *joblibBench) report(w int, ids []string, status string) error {
	if status == "running" && b.o.start {
		return nil // the claim started them
	}
	if b.o.flow == "contract" {
		return patchEach(b.cs[w])(w, ids, status)
	}
	ups := make([]map[string]any, len(ids))
	for i, id := range ids {
		ups[i] = map[string]any{"task_id": id, "status": status}
	}
	var out struct {
		Results []struct {
			Problem map[string]any `json:"problem"`
		} `json:"results"`
	}
	body := map[string]any{"updates": ups}
	var err error
	if b.o.flow == "socket" {
		err = b.socks[w].call("update_tasks", body, &out)
	} else {
		err = b.cs[w].do("POST", "/tasks/update-batch", body, &out)
	}
	if err != nil {
		return err
	}
	if len(out.Results) != len(ids) {
		return fmt.Errorf("%d results for %d reports", len(out.Results), len(ids))
	}
	for _, r := range out.Results {
		if r.Problem != nil {
			return fmt.Errorf("report refused: %v", r.Problem)
		}
	}
	return nil
}

// rawBench is the ceiling: the least a claim → complete loop can cost on
// this PostgreSQL.
type rawBench struct {
	o          options
	pool       *pgxpool.Pool
	statements atomic.Int64
}

func newRawBench(ctx context.Context, url string, o options) (*rawBench, error) {
	b := &rawBench{o: o}
	var err error
	b.pool, err = taskPool(ctx, url, "raw_tasks", rawShapes[o.rawShape].ddl, &b.statements)
	return b, err
}

// rawShape is a table and change sequence for the raw loop (-raw-shape).
// The shapes beyond narrow split joblib's PostgreSQL work per task into the
// part any server pays for the contract's changes on joblib's table and the
// part its own statements add (BENCHMARKS.md, fifteenth round).
type rawShape struct {
	ddl func(table string) string
	// claimSet is what the claim sets besides the status, worker and
	// claimed_at; running, when set, is a third change per task, between
	// the claim (then to claimed) and the completion.
	claimSet, running string
}

var rawShapes = map[string]rawShape{
	"narrow":    {ddl: narrowTableDDL},
	"tasks":     {ddl: tasksTableDDL(false), claimSet: rawTasksClaimSet},
	"tasks3":    {ddl: tasksTableDDL(false), claimSet: rawTasksClaimSet, running: rawRunningSet},
	"tasks3hot": {ddl: tasksTableDDL(true), claimSet: rawTasksClaimSet, running: "prev_status = 'running', started_at = now(), updated_at = now()"},
	"state3":    {ddl: stateTableDDL, claimSet: rawTasksClaimSet, running: rawRunningSet},
}

// rawRunningSet is the running change of the three-change shapes.
const rawRunningSet = "status = 'running', started_at = now(), updated_at = now()"

// rawTasksClaimSet is what joblib's claim changes besides the status.
const rawTasksClaimSet = ", updated_at = now(), attempt = attempt + 1, worker_id = '00000000-0000-4000-8000-000000000003'"

// narrowTableDDL is the least a task table needs: an id, a status with a
// partial index on pending, timestamps.
func narrowTableDDL(t string) string {
	return `CREATE TABLE ` + t + ` (id bigserial PRIMARY KEY, status text NOT NULL DEFAULT 'pending',
		worker int, payload jsonb, claimed_at timestamptz, started_at timestamptz, completed_at timestamptz);
		CREATE INDEX ` + t + `_pending ON ` + t + ` (id) WHERE status = 'pending'`
}

// tasksTableDDL is a table shaped like joblib's tasks (migrations up to
// 190): its columns, and eleven indexes on the same columns and predicates,
// a bigint key and a unique uuid standing in for its uuid key and unique
// seq. hot gives the rows room for HOT updates on their page.
func tasksTableDDL(hot bool) func(string) string {
	return func(t string) string {
		ddl := `CREATE TABLE ` + t + ` (id bigserial PRIMARY KEY, status text NOT NULL DEFAULT 'pending',
		worker int, payload jsonb, claimed_at timestamptz, started_at timestamptz, completed_at timestamptz,
		uid uuid NOT NULL DEFAULT gen_random_uuid(), job_id uuid NOT NULL DEFAULT '00000000-0000-4000-8000-000000000001',
		worker_id uuid, lost_worker_id uuid, room_id text NOT NULL DEFAULT 'room-a',
		created_by_id uuid DEFAULT '00000000-0000-4000-8000-000000000002', attempt int NOT NULL DEFAULT 0,
		created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now(),
		error text, result text, task_timeout int, heartbeat_timeout int, deadline_at timestamptz,
		progress_current float8, progress_total float8, progress_message text, progress_at timestamptz,
		priority int NOT NULL DEFAULT 0, run_at timestamptz, delayed boolean NOT NULL DEFAULT false, errors text, prev_status text);
		CREATE UNIQUE INDEX ` + t + `_uid ON ` + t + ` (uid);
		CREATE INDEX ` + t + `_claim ON ` + t + ` (job_id, status, id);
		CREATE INDEX ` + t + `_room ON ` + t + ` (room_id, created_at, id);
		` + partialTaskIndexes(t)
		if hot {
			ddl += `;
		ALTER TABLE ` + t + ` SET (fillfactor = 80)`
		}
		return ddl
	}
}

// stateTableDDL is the bound of a task table split in two: the columns a
// task's changes touch, in a narrow row with the key and the partial
// indexes of the statuses joblib looks tasks up by (ready, held, past their
// deadline, finished, delayed, pending per creator, pending), and none of
// tasks' full indexes (seq, job and status, room), which would stay with the
// wide row that the changes leave alone.
func stateTableDDL(t string) string {
	return `CREATE TABLE ` + t + ` (id bigserial PRIMARY KEY, status text NOT NULL DEFAULT 'pending',
		worker int, payload jsonb, claimed_at timestamptz, started_at timestamptz, completed_at timestamptz,
		job_id uuid NOT NULL DEFAULT '00000000-0000-4000-8000-000000000001', worker_id uuid,
		created_by_id uuid DEFAULT '00000000-0000-4000-8000-000000000002', attempt int NOT NULL DEFAULT 0,
		updated_at timestamptz NOT NULL DEFAULT now(), deadline_at timestamptz,
		priority int NOT NULL DEFAULT 0, run_at timestamptz, delayed boolean NOT NULL DEFAULT false, prev_status text);
		` + partialTaskIndexes(t)
}

// partialTaskIndexes are the partial indexes of tasks (migrations up to
// 190) on the columns of the shapes' table t: the statuses joblib looks
// tasks up by.
func partialTaskIndexes(t string) string {
	return `CREATE INDEX ` + t + `_pending ON ` + t + ` (id) WHERE status = 'pending';
		CREATE INDEX ` + t + `_creator ON ` + t + ` (created_by_id) WHERE status = 'pending';
		CREATE INDEX ` + t + `_deadline ON ` + t + ` (deadline_at) WHERE status IN ('claimed', 'running');
		CREATE INDEX ` + t + `_delayed ON ` + t + ` (run_at) WHERE status = 'pending' AND delayed;
		CREATE INDEX ` + t + `_finished ON ` + t + ` (status, completed_at) WHERE status IN ('completed', 'failed', 'cancelled');
		CREATE INDEX ` + t + `_ready ON ` + t + ` (job_id, priority DESC, id) WHERE status = 'pending' AND NOT delayed;
		CREATE INDEX ` + t + `_worker ON ` + t + ` (worker_id, status) WHERE status IN ('claimed', 'running')`
}

// taskPool opens a counted pool and creates table with ddl.
func taskPool(ctx context.Context, url, table string, ddl func(string) string, statements *atomic.Int64) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 32
	cfg.ConnConfig.Tracer = counter{statements}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if _, err = pool.Exec(ctx, ddl(table)); err != nil {
		pool.Close()
		return nil, fmt.Errorf("create %s: %w", table, err)
	}
	return pool, nil
}

func (b *rawBench) close() { b.pool.Close() }

func (b *rawBench) round(ctx context.Context) (result, error) {
	if _, err := b.pool.Exec(ctx, "INSERT INTO raw_tasks (payload) SELECT jsonb_build_object('i', i) FROM generate_series(1, $1) i", b.o.tasks); err != nil {
		return result{}, fmt.Errorf("fill raw_tasks: %w", err)
	}
	shape := rawShapes[b.o.rawShape]
	claimed := "running"
	if shape.running != "" {
		claimed = "claimed"
	}
	claim := `UPDATE raw_tasks SET status = '` + claimed + `', worker = $1, claimed_at = now()` + shape.claimSet + `
		WHERE id = (SELECT id FROM raw_tasks WHERE status = 'pending' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
		RETURNING id`
	complete := "UPDATE raw_tasks SET status = 'completed', completed_at = now() WHERE id = $1"
	var running string
	if shape.running != "" {
		running = "UPDATE raw_tasks SET " + shape.running + " WHERE id = $1"
	}
	if b.o.rawNotify {
		claim = "WITH c AS (" + claim + ") SELECT id FROM c WHERE pg_notify('raw_bench', id::text)::text IS NOT NULL"
		notifying := func(stmt string) string {
			return "WITH c AS (" + stmt + " RETURNING id) SELECT count(pg_notify('raw_bench', id::text)::text) FROM c"
		}
		complete = notifying(complete)
		if running != "" {
			running = notifying(running)
		}
	}
	lat := make([][]time.Duration, b.o.workers)
	var failed atomic.Value
	var wg sync.WaitGroup
	s0 := b.statements.Load()
	c0, p0, a0, k0 := sampleCPU(), backendCPU(ctx, "r"), auxCPU(ctx), workCounters(ctx)
	start := time.Now()
	for w := range b.o.workers {
		wg.Go(func() {
			for {
				t0 := time.Now()
				var id int64
				err := b.pool.QueryRow(ctx, claim, w).Scan(&id)
				if err == pgx.ErrNoRows {
					return
				}
				if err != nil {
					failed.Store(err)
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
				if running != "" {
					if _, err := b.pool.Exec(ctx, running, id); err != nil {
						failed.Store(err)
						return
					}
				}
				if _, err := b.pool.Exec(ctx, complete, id); err != nil {
					failed.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	r := result{elapsed: time.Since(start), claims: slices.Concat(lat...), statements: b.statements.Load() - s0}
	r.proc, r.machine = sampleCPU().since(c0)
	r.pg, r.aux, r.work = backendCPU(ctx, "r").since(p0), auxCPU(ctx).since(a0), workSince(ctx, k0)
	if err, _ := failed.Load().(error); err != nil {
		return result{}, err
	}
	r.tasks = len(r.claims)
	if r.tasks != b.o.tasks {
		return result{}, fmt.Errorf("raw loop processed %d tasks, want %d", r.tasks, b.o.tasks)
	}
	return r, nil
}

// floorBench is the contract's flow at its least: the same three HTTP
// requests per task (with -batch N, one claim for up to N tasks and the two
// PATCHes per task), to a server that runs the raw loop's statements (and
// one for "running") and nothing else: no authentication, no owner checks,
// no events. Its ratio to the raw loop is the most that any server speaking
// the contract over HTTP could reach on this machine.
type floorBench struct {
	o          options
	pool       *pgxpool.Pool
	srv        *httptest.Server
	c          *client
	statements atomic.Int64
}

func newFloorBench(ctx context.Context, url string, o options) (*floorBench, error) {
	b := &floorBench{o: o}
	var err error
	if b.pool, err = taskPool(ctx, url, "floor_tasks", narrowTableDDL, &b.statements); err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /tasks/claim", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Worker int `json:"worker_id,string"`
		}
		_ = json.NewDecoder(r.Body).Decode(&in)
		rows, err := b.pool.Query(r.Context(), `UPDATE floor_tasks SET status = 'claimed', worker = $1, claimed_at = now()
			WHERE id IN (SELECT id FROM floor_tasks WHERE status = 'pending' ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)
			RETURNING id`, in.Worker, max(o.batch, 1))
		var ids []int64
		if err == nil {
			ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		tasks := make([]map[string]any, len(ids))
		for i, id := range ids {
			tasks[i] = map[string]any{"id": strconv.FormatInt(id, 10), "status": "claimed"}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"tasks": tasks})
	})
	mux.HandleFunc("PATCH /tasks/{id}", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Status string `json:"status"`
		}
		_ = json.NewDecoder(r.Body).Decode(&in)
		col := "completed_at"
		if in.Status == "running" {
			col = "started_at"
		}
		if _, err := b.pool.Exec(r.Context(), "UPDATE floor_tasks SET status = $2, "+col+" = now() WHERE id = $1", r.PathValue("id"), in.Status); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"id": r.PathValue("id"), "status": in.Status})
	})
	b.srv = httptest.NewServer(mux)
	b.c = &client{base: b.srv.URL, http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.workers * 2}}}
	return b, nil
}

func (b *floorBench) close() {
	b.srv.Close()
	b.pool.Close()
}

func (b *floorBench) round(ctx context.Context) (result, error) {
	if _, err := b.pool.Exec(ctx, "INSERT INTO floor_tasks (payload) SELECT jsonb_build_object('i', i) FROM generate_series(1, $1) i", b.o.tasks); err != nil {
		return result{}, fmt.Errorf("fill floor_tasks: %w", err)
	}
	s0 := b.statements.Load()
	c0, p0, a0, k0 := sampleCPU(), backendCPU(ctx, "f"), auxCPU(ctx), workCounters(ctx)
	start := time.Now()
	claims, tasks, err := workLoop(b.o.workers, func(w int) ([]string, error) {
		var out struct {
			Tasks []struct {
				ID string `json:"id"`
			} `json:"tasks"`
		}
		if err := b.c.do("POST", "/tasks/claim", map[string]any{"worker_id": strconv.Itoa(w)}, &out); err != nil {
			return nil, err
		}
		ids := make([]string, len(out.Tasks))
		for i, t := range out.Tasks {
			ids[i] = t.ID
		}
		return ids, nil
	}, patchEach(b.c))
	r := result{elapsed: time.Since(start), claims: claims, statements: b.statements.Load() - s0, tasks: tasks}
	r.proc, r.machine = sampleCPU().since(c0)
	r.pg, r.aux, r.work = backendCPU(ctx, "f").since(p0), auxCPU(ctx).since(a0), workSince(ctx, k0)
	if err != nil {
		return result{}, err
	}
	if r.tasks != b.o.tasks {
		return result{}, fmt.Errorf("HTTP floor processed %d tasks, want %d", r.tasks, b.o.tasks)
	}
	return r, nil
}

type counter struct{ n *atomic.Int64 }

func (c counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// prepare returns a database URL of its own: a temp SQLite file, or a fresh
// schema in the given PostgreSQL.
func prepare(ctx context.Context, dbURL string) (string, func(), error) {
	if dbURL == "" {
		dir, err := os.MkdirTemp("", "joblib-bench-")
		if err != nil {
			return "", nil, err
		}
		return filepath.Join(dir, "bench.db"), func() { os.RemoveAll(dir) }, nil
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return "", nil, err
	}
	schema := fmt.Sprintf("bench_%d", time.Now().UnixNano())
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return "", nil, err
	}
	sep := "?"
	if strings.Contains(dbURL, "?") {
		sep = "&"
	}
	return dbURL + sep + "search_path=" + schema, func() {
		_, _ = conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		conn.Close(ctx)
	}, nil
}

type client struct {
	base, token string
	http        *http.Client
}

func (c *client) do(method, path string, body, out any) error {
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(method, c.base+path, bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	res, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	if res.StatusCode >= 300 {
		return fmt.Errorf("%s %s: %d %s", method, path, res.StatusCode, raw)
	}
	if out != nil {
		return json.Unmarshal(raw, out)
	}
	return nil
}

// cpuSample is this process's CPU time and the machine's busy CPU time
// (all CPUs' non-idle jiffies of /proc/stat) at one moment.
type cpuSample struct{ proc, machine time.Duration }

func sampleCPU() cpuSample {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	c := cpuSample{proc: time.Duration(ru.Utime.Nano() + ru.Stime.Nano())}
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return c
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	// cpu user nice system idle iowait irq softirq steal ...
	f := strings.Fields(line)
	var busy int64
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i != 3 && i != 4 && i < 8 { // not idle, not iowait, not guest
			busy += n
		}
	}
	c.machine = time.Duration(busy) * 10 * time.Millisecond // USER_HZ = 100
	return c
}

func (c cpuSample) since(c0 cpuSample) (proc, machine time.Duration) {
	return c.proc - c0.proc, c.machine - c0.machine
}

// backends is a connection for reading pg_stat_activity (PostgreSQL only).
var backends *pgx.Conn

// dbWork is what the statements of this database have done so far
// (pg_stat_statements, updated as each statement ends; the rounds run one
// at a time): the shared buffers they touched and the WAL records and bytes
// they wrote. Unlike CPU time, the machine's load does not move these
// counts. All are -1 without the extension.
type dbWork struct {
	blocks, walRecords, walBytes int64
}

var unknownWork = dbWork{-1, -1, -1}

func workCounters(ctx context.Context) dbWork {
	if backends == nil {
		return unknownWork
	}
	var w dbWork
	err := backends.QueryRow(ctx, `SELECT coalesce(sum(shared_blks_hit + shared_blks_read), 0)::bigint,
		coalesce(sum(wal_records), 0)::bigint, coalesce(sum(wal_bytes), 0)::bigint FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&w.blocks, &w.walRecords, &w.walBytes)
	if err != nil {
		return unknownWork
	}
	return w
}

// workSince is the work done since the counts w0, unknown when either is.
func workSince(ctx context.Context, w0 dbWork) dbWork {
	w := workCounters(ctx)
	if w.blocks < 0 || w0.blocks < 0 {
		return unknownWork
	}
	return dbWork{w.blocks - w0.blocks, w.walRecords - w0.walRecords, w.walBytes - w0.walBytes}
}

// pgTicks is the CPU time, in clock ticks, of each PostgreSQL backend of
// one system (its application_name ends with sys).
type pgTicks map[int]int64

func backendCPU(ctx context.Context, sys string) pgTicks {
	return procTicks(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1", fmt.Sprintf("claimbench%d%s", os.Getpid(), sys))
}

// auxCPU is the CPU time of PostgreSQL's own processes (WAL writer,
// checkpointer, background writer, autovacuum workers present at the
// sample): the WAL a system's statements write is flushed there. It is
// shared with anything else the server runs.
func auxCPU(ctx context.Context) pgTicks {
	return procTicks(ctx, "SELECT pid FROM pg_stat_activity WHERE backend_type <> 'client backend'")
}

func procTicks(ctx context.Context, query string, args ...any) pgTicks {
	out := pgTicks{}
	if backends == nil {
		return out
	}
	rows, err := backends.Query(ctx, query, args...)
	if err != nil {
		return out
	}
	pids, _ := pgx.CollectRows(rows, pgx.RowTo[int])
	for _, pid := range pids {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// Fields after the parenthesised command: state is field 3, utime 14, stime 15.
		_, rest, _ := strings.Cut(string(raw), ") ")
		f := strings.Fields(rest)
		if len(f) > 12 {
			u, _ := strconv.ParseInt(f[11], 10, 64)
			st, _ := strconv.ParseInt(f[12], 10, 64)
			out[pid] = u + st
		}
	}
	return out
}

func (t pgTicks) since(t0 pgTicks) time.Duration {
	var n int64
	for pid, v := range t {
		n += v - t0[pid]
	}
	return time.Duration(n) * 10 * time.Millisecond
}

// perfControl writes cmd ("enable" or "disable") to perf's control FIFO at
// path (none: nothing to do).
func perfControl(path, cmd string) error {
	if path == "" {
		return nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("perf control: %w", err)
	}
	defer f.Close()
	if _, err := f.WriteString(cmd + "\n"); err != nil {
		return fmt.Errorf("perf control: %w", err)
	}
	return nil
}
