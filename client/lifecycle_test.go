package client

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
)

// The hash Run uploads under is the server's: the contract's vector.
func TestRequestHash(t *testing.T) {
	t.Parallel()
	got := RequestHash(map[string]string{"path": "/data"})
	if got != "cc2a66974085ce9f0bad658dea3cec4422bde979305a7bd08dd771bba5214ff2" {
		t.Fatalf("RequestHash = %s", got)
	}
}

// A provider served by Run: a reader's GET dispatches provider_request, the
// handler gets the reader's parameters, and the SDK uploads the result under
// the hash the server waits on (non-ASCII and HTML characters included, which
// Go's encoding/json would hash differently). A second read comes from the
// cache; a failing handler uploads nothing, so the reader times out.
func TestRunProvider(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		ts := startServer(t, db, 5*time.Second)
		ctx := context.Background()
		c := dial(t, ts, WithPollInterval(time.Hour))
		var calls atomic.Int32
		prov, err := c.RegisterProvider(ctx, ProviderSpec{Room: "r1", Category: "files", Name: "list"},
			func(ctx context.Context, params map[string]string) ([]byte, error) {
				calls.Add(1)
				if params["fail"] == "1" {
					return nil, errors.New("no such directory")
				}
				return json.Marshal(params)
			})
		if err != nil {
			t.Fatal(err)
		}
		png, err := c.RegisterProvider(ctx, ProviderSpec{Room: "r1", Category: "images", Name: "thumb", ContentType: "image/png"},
			func(ctx context.Context, params map[string]string) ([]byte, error) {
				return []byte{0x89, 'P', 'N', 'G', 0, 0xff}, nil
			})
		if err != nil {
			t.Fatal(err)
		}
		if prov.FullName != "r1:files:list" || prov.WorkerID == nil || *prov.WorkerID != c.WorkerID() {
			t.Fatalf("provider %+v, worker %s", prov, c.WorkerID())
		}
		running(t, c, nil) // providers only: no task handler
		eventually(t, "the socket joined", func() bool { return c.joinCount() == 1 })

		reader := dial(t, ts)
		params := map[string]string{"path": "/dätä<&>", "q": "x\ny\x7f\U0001F600"}
		body, err := reader.Read(ctx, "r1", prov.FullName, params, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var echoed map[string]string
		if err := json.Unmarshal(body, &echoed); err != nil || echoed["path"] != params["path"] || echoed["q"] != params["q"] {
			t.Fatalf("read %q (%v), want the parameters back", body, err)
		}
		if _, err := reader.Read(ctx, "r1", prov.FullName, params, 5*time.Second); err != nil || calls.Load() != 1 {
			t.Fatalf("second read: %v, handler called %d times, want once (cached)", err, calls.Load())
		}

		_, err = reader.Read(ctx, "r1", prov.FullName, map[string]string{"fail": "1"}, time.Second)
		var pe *ProblemError
		if !errors.Is(err, ErrProviderTimeout) || !errors.As(err, &pe) || pe.RetryAfter != 2*time.Second {
			t.Fatalf("read of a failing provider: %v, want ErrProviderTimeout with Retry-After 2s", err)
		}

		req, _ := http.NewRequest(http.MethodGet, ts.url+"/v1/joblib/rooms/r1/providers/"+png.FullName+"?size=64", nil)
		req.Header.Set("Authorization", "Bearer "+ts.token)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 || res.Header.Get("Content-Type") != "image/png" {
			t.Fatalf("binary provider: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
		}
	})
}

// restartable runs a server on a fixed local address: stop shuts it down as
// SIGTERM would, and restart starts a new server on the same database and
// address.
func restartable(t *testing.T, db *models.DB) (ts *testServer, stop func(), restart func() *testServer) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ts, stop = serveOn(t, db, 5*time.Second, ln)
	restart = func() *testServer {
		var ln2 net.Listener
		eventually(t, "the address is free again", func() bool {
			ln2, err = net.Listen("tcp", addr)
			return err == nil
		})
		ts2, _ := serveOn(t, db, 5*time.Second, ln2)
		return ts2
	}
	return ts, stop, restart
}

// A server stopped with a task claimed and started again on the same
// database and address: the SDK reconnects to the new process within the
// grace, keeps its worker, completes the task it held across the restart
// and takes new ones.
func TestRunAcrossServerRestart(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		ts, stop, restart := restartable(t, db)
		c := dial(t, ts, WithPollInterval(200*time.Millisecond), WithReconnectBackoff(20*time.Millisecond, 100*time.Millisecond))
		job, err := c.RegisterJob(context.Background(), "r1", "modifiers", "restart", nil)
		if err != nil {
			t.Fatal(err)
		}
		started := make(chan struct{}, 1)
		release := make(chan struct{})
		running(t, c, func(ctx context.Context, task Task) (any, error) {
			if string(task.Payload) == `{"hold":true}` {
				started <- struct{}{}
				<-release
			}
			return "done", nil
		})
		eventually(t, "the socket joined", func() bool { return c.joinCount() == 1 })
		wid := c.WorkerID()
		held := ts.submit(t, "r1", job.FullName, map[string]bool{"hold": true})
		<-started

		stop()
		ts2 := restart()
		eventually(t, "the socket re-joined the new server", func() bool { return c.joinCount() == 2 })
		close(release)

		got := ts2.waitDone(t, held)
		if got.Status != "completed" || got.WorkerID == nil || *got.WorkerID != wid {
			t.Fatalf("task held across the restart: %+v", got)
		}
		next := ts2.waitDone(t, ts2.submit(t, "r1", job.FullName, map[string]bool{"hold": false}))
		if next.Status != "completed" || *next.WorkerID != wid || c.WorkerID() != wid {
			t.Fatalf("task after the restart: %+v (worker now %s, was %s)", next, c.WorkerID(), wid)
		}
	})
}

// The server lost the worker (here an operator deleted it; a restart after
// an outage longer than the grace does the same): Run registers a new
// worker with the same job and provider, re-joins bound to it, and serves
// both again without the program doing anything.
func TestRunRegistersAgainWhenTheServerLostTheWorker(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		ts := startServer(t, db, 5*time.Second)
		ctx := context.Background()
		c := dial(t, ts, WithPollInterval(100*time.Millisecond), WithReconnectBackoff(20*time.Millisecond, 100*time.Millisecond))
		job, err := c.RegisterJob(ctx, "r1", "modifiers", "again", nil)
		if err != nil {
			t.Fatal(err)
		}
		prov, err := c.RegisterProvider(ctx, ProviderSpec{Room: "r1", Category: "files", Name: "again"},
			func(ctx context.Context, params map[string]string) ([]byte, error) { return []byte(`"here"`), nil })
		if err != nil {
			t.Fatal(err)
		}
		running(t, c, func(ctx context.Context, task Task) (any, error) { return "again", nil })
		eventually(t, "the socket joined", func() bool { return c.joinCount() == 1 })
		old := c.WorkerID()

		if st := ts.rest(t, http.MethodDelete, "/workers/"+old, nil, nil, nil); st != http.StatusNoContent {
			t.Fatalf("delete worker: %d", st)
		}
		eventually(t, "a new worker", func() bool { w := c.WorkerID(); return w != "" && w != old })
		eventually(t, "the socket re-joined as the new worker", func() bool { return c.joinCount() >= 2 })
		wid := c.WorkerID()

		got := ts.waitDone(t, ts.submit(t, "r1", job.FullName, map[string]any{}))
		if got.Status != "completed" || *got.WorkerID != wid {
			t.Fatalf("task after re-registration: %+v, want completed by %s", got, wid)
		}
		body, err := dial(t, ts).Read(ctx, "r1", prov.FullName, nil, 5*time.Second)
		if err != nil || string(body) != `"here"` {
			t.Fatalf("provider after re-registration: %q %v", body, err)
		}
		if err := c.Heartbeat(ctx); err != nil {
			t.Fatalf("heartbeat of the new worker: %v", err)
		}
		c.mu.Lock()
		n := c.reregs
		c.mu.Unlock()
		if n != 1 {
			t.Fatalf("%d workers re-created, want 1", n)
		}
	})
}

// The worker is removed by another node whose news never reaches this one
// (its bus message lost, say): this node keeps the socket open, so the SDK
// learns of it only from its next claim's 404, and registers again then.
// This node's keep-alive, which would also find the worker gone and close
// its socket, runs once an hour here.
func TestRunRegistersAgainWhenAClaimFindsTheWorkerGone(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		ts := startServer(t, db, 5*time.Second, func(rc *server.RealtimeConfig) { rc.KeepAliveInterval = time.Hour })
		ctx := context.Background()
		c := dial(t, ts, WithPollInterval(100*time.Millisecond), WithReconnectBackoff(20*time.Millisecond, 100*time.Millisecond))
		job, err := c.RegisterJob(ctx, "r1", "modifiers", "gone", nil)
		if err != nil {
			t.Fatal(err)
		}
		running(t, c, func(ctx context.Context, task Task) (any, error) { return "again", nil })
		eventually(t, "the socket joined", func() bool { return c.joinCount() == 1 })
		old := c.WorkerID()

		// Another node, on its own bus: this node's sockets hear nothing.
		other := joblib.New(joblib.Config{DB: db, Bus: events.NewLocalBus(), Settings: joblib.DefaultSettings()})
		res, err := other.CleanupWorker(ctx, uuid.MustParse(old), joblib.CleanupParams{Path: joblib.PathSweeper})
		if err != nil || res.Cleaned != 1 {
			t.Fatalf("cleanup on the other node: %+v %v", res, err)
		}
		eventually(t, "a new worker", func() bool { w := c.WorkerID(); return w != "" && w != old })
		eventually(t, "the socket joined as the new worker", func() bool { return c.joinCount() >= 2 })
		wid := c.WorkerID()
		got := ts.waitDone(t, ts.submit(t, "r1", job.FullName, map[string]any{}))
		if got.Status != "completed" || *got.WorkerID != wid {
			t.Fatalf("task after re-registration: %+v, want completed by %s", got, wid)
		}
	})
}

// WithProviderConcurrency bounds the provider handlers running at once:
// reads of distinct parameters arrive together, and no more than the bound
// run at the same moment, while the bound is reached.
func TestRunProviderConcurrency(t *testing.T) {
	t.Parallel()
	db := dbtest.Open(t, models.SQLite)
	ts := startServer(t, db, 5*time.Second)
	ctx := context.Background()
	const bound, reads = 2, 6
	c := dial(t, ts, WithPollInterval(time.Hour), WithProviderConcurrency(bound))
	var now, peak atomic.Int32
	prov, err := c.RegisterProvider(ctx, ProviderSpec{Room: "r1", Category: "files", Name: "slow"},
		func(ctx context.Context, params map[string]string) ([]byte, error) {
			n := now.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			// Hold until the bound is reached (or 2 s), then a little more, so
			// that the peak does not depend on how fast the reads arrive.
			for deadline := time.Now().Add(2 * time.Second); now.Load() < bound && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(50 * time.Millisecond)
			now.Add(-1)
			return []byte(`"` + params["i"] + `"`), nil
		})
	if err != nil {
		t.Fatal(err)
	}
	running(t, c, nil)
	eventually(t, "the socket joined", func() bool { return c.joinCount() == 1 })
	reader := dial(t, ts)
	errs := make(chan error, reads)
	for i := range reads {
		go func() {
			body, err := reader.Read(ctx, "r1", prov.FullName, map[string]string{"i": string(rune('a' + i))}, 10*time.Second)
			if err == nil && string(body) != `"`+string(rune('a'+i))+`"` {
				err = errors.New("read " + string(body))
			}
			errs <- err
		}()
	}
	for range reads {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if p := peak.Load(); p != bound {
		t.Fatalf("%d provider handlers ran at once, want %d", p, bound)
	}
}

// Run refuses to start without something to serve, and jobs without a
// handler.
func TestRunNeedsRegistrations(t *testing.T) {
	t.Parallel()
	db := dbtest.Open(t, models.SQLite)
	ts := startServer(t, db, 5*time.Second)
	ctx := context.Background()
	c := dial(t, ts)
	if err := c.Run(ctx, func(context.Context, Task) (any, error) { return nil, nil }); err == nil {
		t.Fatal("Run with nothing registered returned nil")
	}
	if _, err := c.RegisterJob(ctx, "r1", "modifiers", "x", nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Run(ctx, nil); err == nil {
		t.Fatal("Run with a job and no handler returned nil")
	}
	if _, err := c.RegisterProvider(ctx, ProviderSpec{Room: "r1", Category: "files", Name: "x"}, nil); err == nil {
		t.Fatal("a provider without a handler was registered")
	}
}

// A server that comes back without the worker (cleaned while it was down,
// as startup recovery does to a worker whose grace ran out): the SDK's
// re-join is refused, so it registers again before joining — with no poll
// to notice otherwise — and takes the next task by push.
func TestRunRegistersAgainAfterARestartLostTheWorker(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		ts, stop, restart := restartable(t, db)
		c := dial(t, ts, WithPollInterval(time.Hour), WithReconnectBackoff(20*time.Millisecond, 100*time.Millisecond))
		job, err := c.RegisterJob(context.Background(), "r1", "modifiers", "lost", nil)
		if err != nil {
			t.Fatal(err)
		}
		running(t, c, func(ctx context.Context, task Task) (any, error) { return "back", nil })
		eventually(t, "the socket joined", func() bool { return c.joinCount() == 1 })
		old := c.WorkerID()
		stop()

		// While no server runs, the worker is cleaned up.
		svc := joblib.New(joblib.Config{DB: db, Bus: events.NewLocalBus(), Settings: joblib.DefaultSettings()})
		if _, err := svc.CleanupWorker(context.Background(), uuid.MustParse(old), joblib.CleanupParams{Path: joblib.PathStartup}); err != nil {
			t.Fatal(err)
		}
		svc.Close()

		ts2 := restart()
		eventually(t, "a new worker joined", func() bool {
			w := c.WorkerID()
			return w != "" && w != old && c.joinCount() == 2
		})
		got := ts2.waitDone(t, ts2.submit(t, "r1", job.FullName, map[string]any{}))
		if got.Status != "completed" || *got.WorkerID != c.WorkerID() || string(got.Result) != `"back"` {
			t.Fatalf("task after the restart: %+v", got)
		}
	})
}
