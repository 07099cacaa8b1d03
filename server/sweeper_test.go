package server_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
)

const (
	liveTimeout  = 2 * time.Second
	liveInterval = time.Second
)

func liveSettings(s *joblib.Settings) {
	s.WorkerTimeout = liveTimeout
	s.SweeperInterval = liveInterval
}

// startSweeper runs a sweeper on e's service and returns once its guard
// has passed (it has led for one worker timeout and swept once).
func startSweeper(t *testing.T, e *env, cfg joblib.SweeperConfig) (*joblib.Sweeper, <-chan joblib.SweepEvent) {
	t.Helper()
	sw := joblib.NewSweeper(e.svc, cfg)
	ch := make(chan joblib.SweepEvent, 1024)
	sw.OnSweep(func(ev joblib.SweepEvent) {
		select {
		case ch <- ev:
		default:
		}
	})
	if err := sw.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sw.Stop)
	deadline := time.After(20 * time.Second)
	for {
		select {
		case ev := <-ch:
			if ev.Outcome == joblib.SweepIdle || ev.Outcome == joblib.SweepActed {
				return sw, ch
			}
		case <-deadline:
			t.Fatal("sweeper did not pass its guard")
		}
	}
}

// statusOf returns the first recorded task_status_event of a task with the
// given status, if any.
func statusOf(ems []events.Emission, taskID, status string) bool {
	for _, em := range ems {
		if ev, ok := em.Event.(events.TaskStatusEvent); ok && ev.ID == taskID && ev.Status == status {
			return true
		}
	}
	return false
}

// A REST-only worker process holding a started task is killed with SIGKILL:
// its task is failed (or requeued, per the job's policy) and the events are
// published within worker timeout + sweep interval + 1 s.
func TestKilledWorkerProcessIsCleanedInTime(t *testing.T) {
	// The four runs are mostly waiting for the sweeper: they run side by
	// side (this test is not parallel with the rest of the package).
	for _, policy := range []string{joblib.OnWorkerLossFail, joblib.OnWorkerLossRequeue} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			eachParallel(t, func(t *testing.T, db *models.DB) {
				e := setup(t, db, withSettings(liveSettings))
				startSweeper(t, e, joblib.SweeperConfig{})
				job := "killed-" + policy
				p := startWorker(t, e.url, e.alice, job, policy, liveTimeout/4, true, 0)
				workerID := p.expect(t, "registered", 10*time.Second)
				taskID := e.submit(e.bob, "r", "r:modifiers:"+job, nil)
				if got := p.expect(t, "claimed", 10*time.Second); got != taskID {
					t.Fatalf("worker claimed %s, want %s", got, taskID)
				}
				e.rec.take()
				if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				killed := time.Now()
				<-p.done
				want := map[string]string{joblib.OnWorkerLossFail: "failed", joblib.OnWorkerLossRequeue: "pending"}[policy]
				var seen []events.Emission
				bound := liveTimeout + liveInterval + time.Second
				for !statusOf(seen, taskID, want) {
					if time.Since(killed) > bound {
						t.Fatalf("no %s task_status_event within %s of SIGKILL", want, bound)
					}
					time.Sleep(5 * time.Millisecond)
					seen = append(seen, e.rec.take()...)
				}
				t.Logf("%s event %s after SIGKILL", want, time.Since(killed).Round(time.Millisecond))
				// The cleanup publishes its events as one batch, delivered one
				// by one: the room's jobs_invalidate follows the status event,
				// possibly after the take above.
				for deadline := time.Now().Add(5 * time.Second); len(of(seen, "jobs_invalidate")) == 0; time.Sleep(5 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("no jobs_invalidate for the worker's room")
					}
					seen = append(seen, e.rec.take()...)
				}
				task := e.do(e.bob, "GET", api+"/tasks/"+taskID, nil).want(200).M()
				if task["status"] != want {
					t.Fatalf("task is %v", task["status"])
				}
				wid := uuid.MustParse(workerID)
				es, err := db.Q(context.Background()).ListCleanupEvents(models.CleanupEventFilter{WorkerID: &wid}, 10)
				if err != nil {
					t.Fatal(err)
				}
				if len(es) != 1 || es[0].Path != joblib.PathSweeper {
					t.Fatalf("audit %+v", es)
				}
			})
		})
	}
}

// eachParallel is dbtest.Each with the dialects' subtests run in parallel.
func eachParallel(t *testing.T, fn func(t *testing.T, db *models.DB)) {
	t.Helper()
	for _, d := range dbtest.Dialects {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			fn(t, dbtest.Open(t, d))
		})
	}
}

// A worker process that heartbeats every timeout/3 while it and the server
// are starved by CPU-bound goroutines is never reaped.
func TestHeartbeatingWorkerUnderCPULoadIsNotReaped(t *testing.T) {
	// The dialects' runs wait side by side (this test is not parallel with
	// the rest of the package); each spins its share of the CPUs, so this
	// process carries as many spinners as before while both runs load it.
	spinners := max(1, runtime.NumCPU()/len(dbtest.Dialects))
	eachParallel(t, func(t *testing.T, db *models.DB) {
		e := setup(t, db, withSettings(liveSettings))
		_, sweeps := startSweeper(t, e, joblib.SweeperConfig{})
		p := startWorker(t, e.url, e.alice, "busy", "", liveTimeout/3, false, runtime.NumCPU())
		workerID := p.expect(t, "registered", 10*time.Second)
		stop := make(chan struct{})
		var spin sync.WaitGroup
		for range spinners {
			spin.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					for i := 0; i < 1_000_000; i++ {
					}
				}
			})
		}
		for len(sweeps) > 0 {
			<-sweeps
		}
		time.Sleep(3 * liveTimeout)
		close(stop)
		spin.Wait()
		var ran int
		for len(sweeps) > 0 {
			if ev := <-sweeps; ev.Outcome == joblib.SweepIdle || ev.Outcome == joblib.SweepActed {
				ran++
			}
		}
		if ran < 3 {
			t.Fatalf("only %d sweeps ran during the load", ran)
		}
		select {
		case l := <-p.lines:
			t.Fatalf("worker stopped: %q", l)
		case <-p.done:
			t.Fatal("worker exited")
		default:
		}
		wid := uuid.MustParse(workerID)
		if _, err := db.Q(context.Background()).GetWorker(wid); err != nil {
			t.Fatalf("worker reaped: %v", err)
		}
	})
}

// proxy is a TCP proxy to PostgreSQL that the test can cut, to make the
// database unreachable from the server without touching the database.
type proxy struct {
	ln     net.Listener
	target string
	cut    atomic.Bool
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go p.serve()
	t.Cleanup(func() { ln.Close(); p.sever() })
	return p
}

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.cut.Load() {
			c.Close()
			continue
		}
		go p.pipe(c)
	}
}

func (p *proxy) pipe(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	p.mu.Unlock()
	go func() { _, _ = io.Copy(up, c); up.Close() }()
	_, _ = io.Copy(c, up)
	c.Close()
}

func (p *proxy) sever() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]struct{}{}
}

// The database is unreachable for longer than the worker timeout and then
// back: no worker that resumed heartbeating is reaped, although every last
// heartbeat was older than the timeout when the database came back.
func TestOutageGuardSparesWorkersThatResume(t *testing.T) {
	u, err := url.Parse(dbtest.URL(t, models.Postgres))
	if err != nil {
		t.Fatal(err)
	}
	px := newProxy(t, u.Host)
	u.Host = px.ln.Addr().String()
	ctx := context.Background()
	db, err := models.Open(ctx, u.String(), models.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// The sweeper looks every 100 ms: without the guard it would judge the
	// workers right after the outage, before their next heartbeat.
	e := setup(t, db, withSettings(func(s *joblib.Settings) {
		liveSettings(s)
		s.SweeperInterval = 100 * time.Millisecond
	}))
	startSweeper(t, e, joblib.SweeperConfig{})

	// Three workers heartbeat every timeout/3, through the outage too (those
	// heartbeats fail). The first heartbeat after the outage comes a while
	// after the database is back: the sweeper has long run by then.
	var ids []string
	for range 3 {
		ids = append(ids, e.do(e.alice, "POST", api+"/workers", nil).want(201).M()["id"].(string))
	}
	var resumed sync.WaitGroup
	var beats, refused atomic.Int64
	stop := make(chan struct{})
	var outage atomic.Bool
	for _, id := range ids {
		resumed.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(liveTimeout / 3):
				}
				req, _ := http.NewRequest("PATCH", e.url+api+"/workers/"+id, nil)
				req.Header.Set("Authorization", "Bearer "+e.alice)
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					continue
				}
				res.Body.Close()
				switch {
				case res.StatusCode == 200:
					beats.Add(1)
				case res.StatusCode == 404:
					refused.Add(1)
				case !outage.Load():
					t.Errorf("heartbeat %d outside the outage", res.StatusCode)
				}
			}
		})
	}
	time.Sleep(liveTimeout)
	outage.Store(true)
	px.cut.Store(true)
	px.sever()
	time.Sleep(liveTimeout + 1500*time.Millisecond)
	px.cut.Store(false)
	time.Sleep(100 * time.Millisecond)
	outage.Store(false)
	before := beats.Load()
	// The guard holds destructive sweeps for one worker timeout after the
	// database is back; the workers stay watched by 100 ms sweeps for a
	// further timeout past that.
	time.Sleep(2 * liveTimeout)
	close(stop)
	resumed.Wait()
	if beats.Load() <= before {
		t.Fatal("no heartbeat succeeded after the outage")
	}
	if n := refused.Load(); n != 0 {
		t.Fatalf("%d heartbeats answered 404: workers were reaped", n)
	}
	for _, id := range ids {
		wid := uuid.MustParse(id)
		if _, err := db.Q(ctx).GetWorker(wid); err != nil {
			t.Fatalf("worker %s reaped: %v", id, err)
		}
	}
}

// A reaped worker's owner is heard from again: heartbeats and late task
// reports answer 404 worker-not-found, and one false positive is recorded
// (audit row and metric), whatever the number of late requests.
func TestReapedWorkerHeardAgainIsFalsePositive(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		e := setup(t, db)
		reg := prometheus.NewRegistry()
		m, err := server.NewMetrics(reg, e.svc)
		if err != nil {
			t.Fatal(err)
		}
		e.registerJob(e.alice, "r", "modifiers", "j")
		w := e.do(e.alice, "POST", api+"/workers", nil).want(201).M()["id"].(string)
		e.registerJob(e.alice, "r", "modifiers", "j", map[string]any{"worker_id": w})
		task := e.submit(e.bob, "r", "r:modifiers:j", nil)
		if c := e.claim(e.alice, w); c == nil || c["id"] != task {
			t.Fatalf("claimed %v", c)
		}
		e.patch(e.alice, task, "running").want(200)
		ctx := context.Background()
		wid := uuid.MustParse(w)
		if err := db.Q(ctx).SetHeartbeatAge([]uuid.UUID{wid}, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
		rep, err := e.svc.Sweep(ctx, joblib.SweepParams{Threshold: time.Minute})
		if err != nil || rep.Result.Cleaned != 1 {
			t.Fatalf("sweep: %v %+v", err, rep.Result)
		}
		// Another user's late heartbeat is no false positive of alice's worker.
		e.do(e.bob, "PATCH", api+"/workers/"+w, nil).problem(404, "worker-not-found")
		if got := testCounter(t, m.FalsePositives.WithLabelValues(joblib.PathSweeper)); got != 0 {
			t.Fatalf("false positives after bob's request: %v", got)
		}
		e.patch(e.alice, task, "completed").problem(404, "worker-not-found")
		e.do(e.alice, "PATCH", api+"/workers/"+w, nil).problem(404, "worker-not-found")
		e.patch(e.alice, task, "failed").problem(404, "worker-not-found")
		if got := testCounter(t, m.FalsePositives.WithLabelValues(joblib.PathSweeper)); got != 1 {
			t.Fatalf("false positives = %v, want 1", got)
		}
		es, err := db.Q(ctx).ListCleanupEvents(models.CleanupEventFilter{WorkerID: &wid}, 10)
		if err != nil || len(es) != 1 || !es[0].HeardAt.Valid() || es[0].HeardVia == nil || *es[0].HeardVia != joblib.HeardViaTaskUpdate {
			t.Fatalf("audit %v %+v", err, es)
		}
		// The task itself is untouched by the late reports; superusers keep the contract's codes.
		if st := e.do(e.bob, "GET", api+"/tasks/"+task, nil).want(200).M()["status"]; st != "failed" {
			t.Fatalf("task %v", st)
		}
		e.patch(e.admin, task, "completed").problem(409, "invalid-task-transition")
		// A gracefully deleted worker is no false positive.
		g := e.do(e.alice, "POST", api+"/workers", nil).want(201).M()["id"].(string)
		e.do(e.alice, "DELETE", api+"/workers/"+g, nil).want(204)
		e.do(e.alice, "PATCH", api+"/workers/"+g, nil).problem(404, "worker-not-found")
		if got := testCounter(t, m.FalsePositives.WithLabelValues(joblib.PathGraceful)); got != 0 {
			t.Fatalf("graceful false positives = %v", got)
		}
		if got := testCounter(t, m.WorkersCleaned.WithLabelValues(joblib.PathSweeper)); got != 1 {
			t.Fatalf("cleaned by sweeper = %v", got)
		}
		if got := testCounter(t, m.WorkersCleaned.WithLabelValues(joblib.PathGraceful)); got != 1 {
			t.Fatalf("cleaned gracefully = %v", got)
		}
	})
}

func testCounter(t *testing.T, c prometheus.Collector) float64 {
	t.Helper()
	return testutil.ToFloat64(c)
}

// /metrics serves the sweeper's, the cleanups' and the database's state.
func TestMetricsEndpoint(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		e := setup(t, db, withRealtime(realtimeCfg()))
		reg := prometheus.NewRegistry()
		if _, err := server.NewMetrics(reg, e.svc); err != nil {
			t.Fatal(err)
		}
		reg.MustRegister(server.SocketCollector(e.rt))
		srv := server.New(e.svc, server.DefaultConfig(), nil)
		srv.Handle("GET /metrics", server.MetricsHandler(reg))
		hs := httptest.NewServer(srv.Handler())
		t.Cleanup(hs.Close)
		mustDialSIO(t, e.url, e.bob)
		e.registerJob(e.alice, "r", "modifiers", "j")
		e.submit(e.bob, "r", "r:modifiers:j", nil)
		res, err := http.Get(hs.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		for _, want := range []string{
			`joblib_workers 1`, `joblib_tasks{status="pending"} 1`, `joblib_tasks{status="failed"} 0`,
			`joblib_workers_cleaned_total{path="sweeper"} 0`, `joblib_false_positives_total{path="disconnect"} 0`,
			`joblib_sweeps_total{outcome="held"} 0`, `joblib_socket_connections 1`,
		} {
			if !strings.Contains(string(b), want+"\n") {
				t.Fatalf("metrics lack %q:\n%s", want, b)
			}
		}
		if _, err := server.NewMetrics(reg, e.svc); err == nil {
			t.Fatal("registering twice must fail")
		} else if !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			t.Fatalf("second registration: %v", err)
		}
	})
}
