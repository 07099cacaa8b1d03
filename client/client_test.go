package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
)

// testServer is a real joblib server (REST and Socket.IO) over db.
type testServer struct {
	url   string
	token string // a regular user's API token
}

func startServer(t *testing.T, db *models.DB, grace time.Duration, opts ...func(*server.RealtimeConfig)) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts, _ := serveNode(t, db, events.NewLocalBus(), grace, ln, "", opts...)
	return ts
}

// serveOn runs a server on ln until stop (or the end of the test) shuts it
// down as a SIGTERM would: sockets closed, workers kept in the database.
func serveOn(t *testing.T, db *models.DB, grace time.Duration, ln net.Listener) (ts *testServer, stop func()) {
	t.Helper()
	return serveNode(t, db, events.NewLocalBus(), grace, ln, "")
}

// serveNode is serveOn over a given bus; token, when set, is an existing
// user's (a second node of the same database), else alice is created.
func serveNode(t *testing.T, db *models.DB, bus events.Bus, grace time.Duration, ln net.Listener, token string, opts ...func(*server.RealtimeConfig)) (ts *testServer, stop func()) {
	t.Helper()
	svc := joblib.New(joblib.Config{DB: db, Bus: bus, Settings: joblib.DefaultSettings()})
	if err := svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	api := server.New(svc, server.DefaultConfig(), nil)
	rc := server.DefaultRealtimeConfig()
	rc.DisconnectGrace = grace
	for _, o := range opts {
		o(&rc)
	}
	rt := api.NewRealtime(rc, nil)
	api.Handle("/socket.io/", rt)
	_ = rt.Start(context.Background())
	srv := httptest.NewUnstartedServer(api.Handler())
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := rt.Shutdown(ctx); err != nil {
				t.Errorf("shutdown realtime: %v", err)
			}
			srv.Close()
			svc.Close()
		})
	}
	t.Cleanup(stop)
	if token != "" {
		return &testServer{url: srv.URL, token: token}, stop
	}
	tok, _, err := svc.CreateToken(context.Background(), "alice", false)
	if err != nil {
		t.Fatal(err)
	}
	return &testServer{url: srv.URL, token: tok}, stop
}

// rest sends a raw REST request and decodes a JSON answer into out.
func (ts *testServer) rest(t *testing.T, method, path string, body any, hdr map[string]string, out any) int {
	t.Helper()
	var b []byte
	if body != nil {
		b, _ = json.Marshal(body)
	}
	req, _ := http.NewRequest(method, ts.url+"/v1/joblib"+path, bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+ts.token)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if out != nil {
		if err := json.NewDecoder(res.Body).Decode(out); err != nil {
			t.Fatalf("%s %s: decode: %v", method, path, err)
		}
	}
	return res.StatusCode
}

// submit posts a task to job and returns its id.
func (ts *testServer) submit(t *testing.T, room, job string, payload any) string {
	t.Helper()
	var task Task
	if st := ts.rest(t, http.MethodPost, "/rooms/"+room+"/tasks/"+url.PathEscape(job), map[string]any{"payload": payload}, nil, &task); st != http.StatusAccepted {
		t.Fatalf("submit: status %d", st)
	}
	return task.ID
}

// waitDone long-polls the task until it is terminal.
func (ts *testServer) waitDone(t *testing.T, id string) Task {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var task Task
		ts.rest(t, http.MethodGet, "/tasks/"+id, nil, map[string]string{"Prefer": "wait=5"}, &task)
		switch task.Status {
		case "completed", "failed", "cancelled":
			return task
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s still %s", id, task.Status)
		}
	}
}

func dial(t *testing.T, ts *testServer, opts ...Option) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, ts.url, ts.token, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// running starts Run in a goroutine and returns a stop that cancels it and
// checks that it returned nil.
func running(t *testing.T, c *Client, h Handler) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, h) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("Run did not return after cancel")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func (c *Client) joinCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.joins
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestREST(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		ts := startServer(t, db, 5*time.Second)
		ctx := context.Background()

		_, err := Dial(ctx, ts.url, "jl_wrong")
		if !errors.Is(err, ErrUnauthorized) {
			t.Fatalf("dial with a bad token: %v, want ErrUnauthorized", err)
		}

		c := dial(t, ts)
		job, err := c.RegisterJob(ctx, "r1", "modifiers", "rest", map[string]any{"type": "object"})
		if err != nil {
			t.Fatal(err)
		}
		if job.FullName != "r1:modifiers:rest" || c.WorkerID() == "" || *job.WorkerID != c.WorkerID() {
			t.Fatalf("job %+v, worker %q", job, c.WorkerID())
		}
		if task, err := c.Claim(ctx); err != nil || task != nil {
			t.Fatalf("claim of an empty queue: %v %v", task, err)
		}
		id := ts.submit(t, "r1", job.FullName, map[string]any{"x": 1})
		task, err := c.Claim(ctx)
		if err != nil || task == nil || task.ID != id || task.Status != "claimed" || string(task.Payload) != `{"x":1}` {
			t.Fatalf("claim: %+v %v", task, err)
		}
		if _, err := c.Update(ctx, id, StatusRunning, nil, ""); err != nil {
			t.Fatal(err)
		}
		if err := c.Heartbeat(ctx); err != nil {
			t.Fatal(err)
		}
		done, err := c.Update(ctx, id, StatusCompleted, map[string]int{"y": 2}, "")
		if err != nil || done.Status != "completed" || string(done.Result) != `{"y":2}` {
			t.Fatalf("complete: %+v %v", done, err)
		}

		// 409: the state machine refuses a second completion.
		_, err = c.Update(ctx, id, StatusCompleted, nil, "")
		var pe *ProblemError
		if !errors.Is(err, ErrConflict) || !errors.As(err, &pe) || pe.Slug() != "invalid-task-transition" || pe.Status != 409 {
			t.Fatalf("second completion: %v", err)
		}
		// 422: a status that does not exist.
		if _, err := c.Update(ctx, id, "bogus", nil, ""); !errors.Is(err, ErrValidation) {
			t.Fatalf("bogus status: %v, want ErrValidation", err)
		}
		// 404: an unknown task.
		_, err = c.Task(ctx, "00000000-0000-4000-8000-000000000000")
		if !errors.Is(err, ErrNotFound) || !errors.As(err, &pe) || pe.Slug() != "task-not-found" || pe.Detail == "" {
			t.Fatalf("unknown task: %v", err)
		}
		if errors.Is(err, ErrConflict) {
			t.Fatal("a 404 matches ErrConflict")
		}

		// Close deletes the worker: its heartbeat is then 404.
		wid := c.WorkerID()
		if err := c.Close(ctx); err != nil {
			t.Fatal(err)
		}
		other := dial(t, ts)
		other.workerID = wid
		if err := other.Heartbeat(ctx); !errors.Is(err, ErrNotFound) {
			t.Fatalf("heartbeat of a closed worker: %v, want ErrNotFound", err)
		}
		if err := c.Close(ctx); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	})
}

func TestProblemRetryAfter(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.Header().Set("Retry-After", "3")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprint(w, `{"type":"/v1/problems/rate-limited","title":"Too Many Requests","status":429,"detail":"slow down"}`)
	}))
	defer srv.Close()
	_, err := Dial(context.Background(), srv.URL, "t")
	var pe *ProblemError
	if !errors.Is(err, ErrRateLimited) || !errors.As(err, &pe) || pe.RetryAfter != 3*time.Second || pe.Detail != "slow down" {
		t.Fatalf("got %v (%+v)", err, pe)
	}
}

// Without a socket (a proxy that serves REST only) Run claims over REST,
// starts each task with PATCH, and hands the handler the task as it is then:
// running, with its start time.
func TestRunOverRESTHandsOverRunningTasks(t *testing.T) {
	t.Parallel()
	db := dbtest.Open(t, models.SQLite)
	ts := startServer(t, db, 5*time.Second)
	target, err := url.Parse(ts.url)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/socket.io/") {
			http.NotFound(w, r)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	restOnly := &testServer{url: front.URL, token: ts.token}
	c := dial(t, restOnly, WithPollInterval(50*time.Millisecond), WithReconnectBackoff(time.Second, time.Second),
		WithLogger(slog.New(slog.DiscardHandler)))
	job, err := c.RegisterJob(context.Background(), "r1", "modifiers", "rest", nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	stop := running(t, c, func(ctx context.Context, task Task) (any, error) {
		mu.Lock()
		defer mu.Unlock()
		started := "no start"
		if task.StartedAt != nil {
			started = "started"
		}
		seen = append(seen, task.Status+" "+started)
		return "done", nil
	})
	for range 2 {
		if got := ts.waitDone(t, ts.submit(t, "r1", job.FullName, map[string]int{})); got.Status != "completed" {
			t.Fatalf("task %+v", got)
		}
	}
	stop()
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(seen, []string{"running started", "running started"}) {
		t.Fatalf("the handler got tasks %q, want running and started", seen)
	}
	c.mu.Lock()
	sc := c.socketClaims
	c.mu.Unlock()
	if sc != 0 {
		t.Fatalf("%d claims over a socket that the proxy refuses", sc)
	}
}

func TestRunPush(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		ts := startServer(t, db, 5*time.Second)
		// No polling within the test: only task_available can deliver.
		c := dial(t, ts, WithPollInterval(time.Hour))
		job, err := c.RegisterJob(context.Background(), "r1", "modifiers", "push", nil)
		if err != nil {
			t.Fatal(err)
		}
		var handled []string
		var mu sync.Mutex
		var notRunning []string
		stop := running(t, c, func(ctx context.Context, task Task) (any, error) {
			var p struct {
				N   int
				Big int
			}
			if err := json.Unmarshal(task.Payload, &p); err != nil {
				return nil, err
			}
			mu.Lock()
			handled = append(handled, task.ID)
			if task.Status != StatusRunning {
				notRunning = append(notRunning, task.Status)
			}
			mu.Unlock()
			if p.Big > 0 {
				return strings.Repeat("x", p.Big), nil
			}
			return map[string]int{"double": 2 * p.N}, nil
		})
		eventually(t, "the socket joined", func() bool { return c.joinCount() == 1 })
		for i := 1; i <= 3; i++ {
			id := ts.submit(t, "r1", job.FullName, map[string]int{"n": i})
			got := ts.waitDone(t, id)
			if got.Status != "completed" || string(got.Result) != fmt.Sprintf(`{"double":%d}`, 2*i) || *got.WorkerID != c.WorkerID() {
				t.Fatalf("task %d: %+v result %s", i, got, got.Result)
			}
		}
		// A result too large for one socket message goes over HTTP.
		big := ts.waitDone(t, ts.submit(t, "r1", job.FullName, map[string]int{"big": 200 << 10}))
		if big.Status != "completed" || len(big.Result) != 200<<10+2 {
			t.Fatalf("large result: %s, %d bytes", big.Status, len(big.Result))
		}
		stop()
		if len(handled) != 4 || len(notRunning) != 0 {
			t.Fatalf("handled %d tasks, want 4; handed over not running: %v", len(handled), notRunning)
		}
		// Each claim went over the socket (claim_tasks, which started the
		// task), not REST, and so did each small outcome (update_tasks).
		c.mu.Lock()
		sc, sr := c.socketClaims, c.socketReports
		c.mu.Unlock()
		if sc < 4 || sr != 3 {
			t.Fatalf("%d claims and %d outcomes over the socket, want at least 4 and 3", sc, sr)
		}
		if err := c.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

func TestRunPollingAndHandlerError(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		ts := startServer(t, db, 5*time.Second)
		c := dial(t, ts, WithPollInterval(50*time.Millisecond))
		c.dropNotices = true // no push: only the polling fallback claims
		job, err := c.RegisterJob(context.Background(), "r1", "modifiers", "poll", nil)
		if err != nil {
			t.Fatal(err)
		}
		running(t, c, func(ctx context.Context, task Task) (any, error) {
			if string(task.Payload) == `{"fail":true}` {
				return nil, errors.New("bad input: fail requested")
			}
			return "ok", nil
		})
		eventually(t, "the socket joined", func() bool { return c.joinCount() == 1 })
		ok := ts.waitDone(t, ts.submit(t, "r1", job.FullName, map[string]bool{"fail": false}))
		if ok.Status != "completed" || string(ok.Result) != `"ok"` {
			t.Fatalf("polled task: %+v", ok)
		}
		bad := ts.waitDone(t, ts.submit(t, "r1", job.FullName, map[string]bool{"fail": true}))
		if bad.Status != "failed" || bad.Error == nil || *bad.Error != "bad input: fail requested" {
			t.Fatalf("failing task: %+v", bad)
		}
	})
}

// A websocket killed while a task runs: the SDK reconnects and re-joins
// within the grace, so the worker keeps its claim and completes the task
// after the grace has passed.
func TestRunReconnectKeepsClaim(t *testing.T) {
	t.Parallel()
	const grace = 700 * time.Millisecond
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		ts := startServer(t, db, grace)
		c := dial(t, ts, WithPollInterval(time.Hour), WithReconnectBackoff(10*time.Millisecond, 50*time.Millisecond))
		job, err := c.RegisterJob(context.Background(), "r1", "modifiers", "slow", nil)
		if err != nil {
			t.Fatal(err)
		}
		started := make(chan struct{})
		release := make(chan struct{})
		running(t, c, func(ctx context.Context, task Task) (any, error) {
			close(started)
			<-release
			return "survived", nil
		})
		eventually(t, "the socket joined", func() bool { return c.joinCount() == 1 })
		id := ts.submit(t, "r1", job.FullName, map[string]any{})
		<-started
		c.mu.Lock()
		c.sock.kill()
		c.mu.Unlock()
		eventually(t, "the socket re-joined", func() bool { return c.joinCount() == 2 })
		// Let the grace of the dropped connection run out: a worker that had
		// not re-joined would be cleaned up and its task failed by now.
		time.Sleep(2 * grace)
		close(release)
		got := ts.waitDone(t, id)
		if got.Status != "completed" || string(got.Result) != `"survived"` || *got.WorkerID != c.WorkerID() {
			t.Fatalf("task after reconnect: %+v", got)
		}
		if err := c.Heartbeat(context.Background()); err != nil {
			t.Fatalf("worker after reconnect: %v", err)
		}
	})
}

// Cancelling Run's context while a handler runs: the handler sees the
// cancellation, Run still reports the task's outcome and returns nil.
func TestRunCancelMidTask(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		ts := startServer(t, db, 5*time.Second)
		c := dial(t, ts, WithPollInterval(time.Hour))
		job, err := c.RegisterJob(context.Background(), "r1", "modifiers", "cancel", nil)
		if err != nil {
			t.Fatal(err)
		}
		started := make(chan struct{})
		stop := running(t, c, func(ctx context.Context, task Task) (any, error) {
			close(started)
			<-ctx.Done()
			return nil, fmt.Errorf("stopped: %w", ctx.Err())
		})
		eventually(t, "the socket joined", func() bool { return c.joinCount() == 1 })
		id := ts.submit(t, "r1", job.FullName, map[string]any{})
		<-started
		stop()
		got := ts.waitDone(t, id)
		if got.Status != "failed" || got.Error == nil || *got.Error != "stopped: context canceled" {
			t.Fatalf("task after cancel: %+v", got)
		}
		if err := c.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}
