package server_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
)

// leaseNode starts e's node lease, advertising its test server's address,
// as serve does; it ends with the test.
func leaseNode(t *testing.T, e *env) {
	t.Helper()
	l := e.svc.NewLease(joblib.LeaseConfig{Addr: strings.TrimPrefix(e.url, "http://")})
	if err := l.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Stop)
}

// userID is the id of token's user.
func userID(t *testing.T, e *env, token string) uuid.UUID {
	t.Helper()
	p, err := e.svc.AuthenticateToken(context.Background(), token)
	if err != nil {
		t.Fatal(err)
	}
	return p.ID
}

// TestHomeRoutingServesAUserOnOneNode: with two live nodes, a fleet whose
// calls reach both nodes at random gets every answer as from one node, and
// every call that reached the node that is not the user's home was
// forwarded to the home node: one node forwards all it got of them, the
// other none. Every task is claimed once and ends completed.
func TestHomeRoutingServesAUserOnOneNode(t *testing.T) {
	t.Parallel()
	cfg := server.DefaultConfig()
	cfg.AllowedOrigins = []string{"*.example.com"}
	a, b := twoNodes(t, withServer(cfg))
	leaseNode(t, a)
	leaseNode(t, b)
	nodes := []*env{a, b}

	const workers, perWorker = 4, 15
	wids := make([]string, workers)
	for w := range workers {
		wids[w] = a.registerJob(a.alice, "home", "modifiers", "Job")["worker_id"].(string)
	}
	// A node reads the live nodes at its first hot call; calls that
	// arrive during that read are served where they arrive.
	sent := [2]int{} // hot calls sent to each node
	for i, n := range nodes {
		if task := n.claim(a.alice, wids[0]); task != nil {
			t.Fatalf("claim with an empty queue: %v", task)
		}
		sent[i]++
	}
	ids := a.submitBatch(a.bob, "home", "home:modifiers:Job", payloads(workers*perWorker))

	var mu sync.Mutex
	claimed := map[string]int{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				// Claim on one node, report on the other, then back.
				first, second := (w+i)%2, (w+i+1)%2
				task := nodes[first].claim(a.alice, wids[w])
				if task == nil {
					t.Errorf("worker %d: claim %d found no task", w, i)
					return
				}
				id := task["id"].(string)
				nodes[second].patch(a.alice, id, "running").want(200)
				nodes[first].patch(a.alice, id, "completed").want(200)
				mu.Lock()
				claimed[id]++
				sent[first] += 2
				sent[second]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(claimed) != len(ids) {
		t.Fatalf("%d distinct tasks claimed, want %d", len(claimed), len(ids))
	}
	for _, id := range ids {
		if claimed[id] != 1 {
			t.Errorf("task %s claimed %d times", id, claimed[id])
		}
		if got := a.do(a.alice, "GET", api+"/tasks/"+id, nil).want(200).M()["status"]; got != "completed" {
			t.Errorf("task %s is %v", id, got)
		}
	}
	fa, fb := a.api.HomeForwarded(), b.api.HomeForwarded()
	switch {
	case fa == 0 && fb == int64(sent[1]):
	case fb == 0 && fa == int64(sent[0]):
	default:
		t.Errorf("forwarded: node a %d of the %d calls it got, node b %d of %d; want all of one node's and none of the other's", fa, sent[0], fb, sent[1])
	}
	if a.api.HomeFallbacks()+b.api.HomeFallbacks() != 0 {
		t.Errorf("fallbacks %d, %d with both nodes up", a.api.HomeFallbacks(), b.api.HomeFallbacks())
	}

	// A browser's call through either node gets one set of CORS headers.
	for _, n := range nodes {
		r := n.do(a.alice, "POST", api+"/tasks/claim", map[string]any{"worker_id": wids[0]}, "Origin: https://ui.example.com").want(200)
		if got := r.Header.Values("Access-Control-Allow-Origin"); len(got) != 1 || got[0] != "https://ui.example.com" {
			t.Errorf("Access-Control-Allow-Origin %q, want it once", got)
		}
		if got := r.Header.Values("Vary"); len(got) != 1 {
			t.Errorf("Vary %q, want one", got)
		}
	}

	// Not routed: a refused credential is answered where it arrives, and a
	// request another node already forwarded is served here.
	before := a.api.HomeForwarded() + b.api.HomeForwarded()
	if before != fa+fb+1 {
		t.Errorf("forwarded %d of the two browser calls, want 1", before-fa-fb)
	}
	for _, n := range nodes {
		n.do("not-a-token", "POST", api+"/tasks/claim", map[string]any{"worker_id": wids[0]}).problem(401, "unauthorized")
		n.do(a.alice, "POST", api+"/tasks/claim", map[string]any{"worker_id": wids[0]}, "X-Joblib-Forwarded: 1").want(200)
	}
	if after := a.api.HomeForwarded() + b.api.HomeForwarded(); after != before {
		t.Errorf("forwarded %d more calls; want none", after-before)
	}
}

// payloads are n distinct task payloads.
func payloads(n int) []map[string]any {
	out := make([]map[string]any, n)
	for i := range out {
		out[i] = map[string]any{"i": i}
	}
	return out
}

// fakeHome writes a lease valid for ttl for a node run that wins user's
// home over every node of nodes, advertising addr.
func fakeHome(t *testing.T, db *models.DB, user uuid.UUID, addr string, ttl time.Duration, nodes ...*env) {
	t.Helper()
	for {
		run := uuid.NewString()
		wins := true
		for _, n := range nodes {
			wins = wins && server.HomeScore(user, run) > server.HomeScore(user, n.svc.Node().Run)
		}
		if !wins {
			continue
		}
		if err := db.Q(context.Background()).AcquireNodeLease(run, "fake-"+run[:8], addr, ttl); err != nil {
			t.Fatal(err)
		}
		return
	}
}

// TestHomeRoutingFallsBackWhenHomeIsUnreachable: a home node whose lease is
// live but whose address refuses connections costs nothing: the call is
// served where it arrived, and the node is passed over for the next calls
// instead of being dialled again.
func TestHomeRoutingFallsBackWhenHomeIsUnreachable(t *testing.T) {
	t.Parallel()
	a, b := twoNodes(t)
	leaseNode(t, a)
	leaseNode(t, b)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := ln.Addr().String()
	_ = ln.Close()
	fakeHome(t, a.db, userID(t, a, a.alice), refused, time.Minute, a, b)

	wid := a.registerJob(a.alice, "gone", "modifiers", "Job")["worker_id"].(string)
	ids := a.submitBatch(a.bob, "gone", "gone:modifiers:Job", payloads(3))
	for i, id := range ids {
		task := a.claim(a.alice, wid)
		if task == nil || task["id"] != id {
			t.Fatalf("claim %d: %v, want task %s", i, task, id)
		}
		a.patch(a.alice, id, "running").want(200)
	}
	if got := a.api.HomeFallbacks(); got != 1 {
		t.Errorf("fallbacks %d, want 1: the unreachable node is passed over after the first", got)
	}
}

// TestHomeRoutingHomeThatDoesNotAnswer: a home node that takes the request
// and never answers (a frozen process) is answered 503 node-unavailable
// with Retry-After once its lease lapses, or at the latest once the write
// budget has passed twice; the call is not run a second time here, and the
// next call passes that node over.
func TestHomeRoutingHomeThatDoesNotAnswer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		budget   time.Duration // JOBLIB_WRITE_DB_TIMEOUT
		lease    time.Duration // the silent home's lease, from before the call
		min, max time.Duration // when the 503 may come
	}{
		// 30 s would be twice the budget: the lapse answers first.
		{"lease lapses", 15 * time.Second, time.Second, 0, 10 * time.Second},
		{"budget passes twice", 300 * time.Millisecond, time.Minute, 600 * time.Millisecond, 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url := dbtest.URL(t, models.Postgres)
			cfg := server.DefaultConfig()
			cfg.WriteDBTimeout = tc.budget
			dbA, busA := pgNode(t, url, "a")
			a := setup(t, dbA, withBus(busA), withServer(cfg))
			leaseNode(t, a)
			wid := a.registerJob(a.alice, "frozen", "modifiers", "Job")["worker_id"].(string)
			id := a.submit(a.bob, "frozen", "frozen:modifiers:Job", nil)
			fakeHome(t, a.db, userID(t, a, a.alice), silentAddr(t), tc.lease, a)

			start := time.Now()
			r := a.do(a.alice, "POST", api+"/tasks/claim", map[string]any{"worker_id": wid})
			waited := time.Since(start)
			r.problem(503, "node-unavailable")
			if r.Header.Get("Retry-After") != "1" {
				t.Errorf("Retry-After %q, want 1", r.Header.Get("Retry-After"))
			}
			if waited < tc.min || waited > tc.max {
				t.Errorf("answered after %v, want between %v and %v", waited, tc.min, tc.max)
			}
			if got := a.do(a.alice, "GET", api+"/tasks/"+id, nil).want(200).M()["status"]; got != "pending" {
				t.Errorf("task is %v after the unanswered claim, want pending: it ran here too", got)
			}
			if task := a.claim(a.alice, wid); task == nil || task["id"] != id {
				t.Errorf("next claim: %v, want task %s served here", task, id)
			}
		})
	}
}

// silentAddr is the address of a listener that accepts connections and
// never reads or answers, as a frozen process's kernel does.
func silentAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}
