package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// TestClusterThreeNodes runs three real `joblib serve` processes on one
// PostgreSQL, started together on an empty database, with real
// socket.io-client UIs and workers on every node, and checks what users of a
// replicated deployment rely on:
//
//   - a burst of tasks driven through all nodes reaches every UI with each
//     status event exactly once, and every worker socket with each
//     task_available exactly once;
//   - a node SIGKILLed mid-task: its worker's task fails within the lease
//     timeout plus the grace (path node), while a worker that reconnected to
//     another node within the grace keeps its worker and its running task;
//   - the sweeper leader SIGKILLed mid-task: another node takes over and its
//     worker's task fails the same way;
//   - a killed node restarted with the same JOBLIB_NODE_ID serves UIs and
//     workers again, and its startup recovery touches nobody alive.
//
// Lease timeout 2 s and grace 1 s keep it short; the worker timeout is 60 s,
// so only node loss (not the sweeper) can fail those tasks in time. It runs
// with each event bus: PostgreSQL NOTIFY and NATS.
func TestClusterThreeNodes(t *testing.T) {
	t.Parallel()
	joblibBinary(t)
	for _, bus := range []string{"notify", "nats"} {
		t.Run(bus, func(t *testing.T) {
			t.Parallel()
			var extra []string
			if bus == "nats" {
				extra = []string{"JOBLIB_BUS_URL=" + testNATSURL(), "JOBLIB_BUS_SUBJECT=joblib.test." + uuid.NewString()}
			}
			clusterThreeNodes(t, extra)
		})
	}
}

func testNATSURL() string {
	if u := os.Getenv("JOBLIB_TEST_NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

func clusterThreeNodes(t *testing.T, extraEnv []string) {
	began := time.Now()
	dbURL := dbtest.URL(t, models.Postgres)
	token := "jl_cluster_" + uuid.NewString()
	env := func(name string) []string {
		return append([]string{"JOBLIB_DATABASE_URL=" + dbURL, "JOBLIB_ADMIN_TOKEN=" + token, "JOBLIB_NODE_ID=" + name,
			"JOBLIB_NODE_LEASE_TIMEOUT=2s", "JOBLIB_DISCONNECT_GRACE=1s", "JOBLIB_SWEEPER_INTERVAL=1s", "JOBLIB_WORKER_TIMEOUT=60s"}, extraEnv...)
	}
	names := []string{"a", "b", "c"}
	nodes := map[string]*proc{}
	for _, n := range names {
		nodes[n] = launchServe(t, env(n)...)
	}
	for _, n := range names {
		nodes[n].waitListening(t)
	}
	startedIn := time.Since(began)

	// Roles: L is the sweeper leader, N is killed first, S survives.
	leader := waitLeader(t, nodes)
	var others []string
	for _, n := range names {
		if n != leader {
			others = append(others, n)
		}
	}
	L, N, S := leader, others[0], others[1]
	sio := func(n string) string { return "http://" + nodes[n].addr }
	base := func(n string) string { return nodes[n].base() }

	const room = "cl"
	const job = room + ":modifiers:J"
	ag := startAgent(t)
	for _, n := range names {
		ag.connect("ui-"+n, sio(n), token)
		ag.emit("ui-"+n, "join_room", map[string]any{"room_id": room})
	}
	// Two more UIs reach the nodes through a round-robin balancer without
	// stickiness: one polling only, one polling then upgrading to websocket.
	rr := roundRobin(t, nodes[L].addr, nodes[N].addr, nodes[S].addr)
	ag.connect("ui-rr-poll", rr, token, "polling")
	ag.connect("ui-rr", rr, token)
	for _, ui := range []string{"ui-rr-poll", "ui-rr"} {
		ag.emit(ui, "join_room", map[string]any{"room_id": room})
	}
	// The forwarding hop: acknowledged emits of a polling client through the
	// balancer (two of three requests forwarded) against one proxied to a
	// single node (none forwarded).
	sticky := roundRobin(t, nodes[S].addr)
	ag.connect("ui-sticky-poll", sticky, token, "polling")
	const hops = 30
	viaRR, viaSticky := ag.emitN("ui-rr-poll", "join_room", map[string]any{"room_id": room}, hops),
		ag.emitN("ui-sticky-poll", "join_room", map[string]any{"room_id": room}, hops)
	// Workers: one per node, plus a second on N that will move to S.
	newWorker := func(via string) string {
		t.Helper()
		st, _, w := call(t, "POST", base(via)+"/workers", token, map[string]any{})
		if st != 201 {
			t.Fatalf("create worker: %d %v", st, w)
		}
		id := w["id"].(string)
		st, _, body := call(t, "PUT", base(via)+"/rooms/"+room+"/jobs", token, map[string]any{"category": "modifiers", "name": "J", "schema": map[string]any{}, "worker_id": id})
		if st != 200 && st != 201 {
			t.Fatalf("register job: %d %v", st, body)
		}
		return id
	}
	workers := map[string]string{} // socket name -> worker id
	bindWorker := func(sock, node, wid string) {
		t.Helper()
		ag.connect(sock, sio(node), token)
		ag.emit(sock, "join_job_room", map[string]any{"job_name": job, "worker_id": wid})
		workers[sock] = wid
	}
	for _, n := range names {
		bindWorker("w-"+n, n, newWorker(n))
	}
	bindWorker("w2-"+N, N, newWorker(N))

	// Burst: tasks submitted, claimed, started and completed through
	// rotating nodes, concurrently.
	const burst = 12
	var mu sync.Mutex
	var burstTasks []string
	var wg sync.WaitGroup
	for i := range burst {
		wg.Go(func() {
			via := names[i%3]
			st, _, task := call(t, "POST", base(via)+"/rooms/"+room+"/tasks/"+job, token, map[string]any{"payload": map[string]any{"i": i}})
			if st != 202 {
				t.Errorf("submit: %d %v", st, task)
				return
			}
			mu.Lock()
			burstTasks = append(burstTasks, task["id"].(string))
			mu.Unlock()
		})
	}
	wg.Wait()
	for i := range burst {
		wg.Go(func() {
			w := workers["w-"+names[i%3]]
			st, _, c := call(t, "POST", base(names[(i+1)%3])+"/tasks/claim", token, map[string]any{"worker_id": w})
			tk, _ := c["task"].(map[string]any)
			if st != 200 || tk == nil {
				t.Errorf("claim: %d %v", st, c)
				return
			}
			id := tk["id"].(string)
			for j, s := range []string{"running", "completed"} {
				if st, _, b := call(t, "PATCH", base(names[(i+2+j)%3])+"/tasks/"+id, token, map[string]any{"status": s}); st != 200 {
					t.Errorf("%s: %d %v", s, st, b)
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for _, ui := range []string{"ui-" + L, "ui-" + N, "ui-" + S, "ui-rr-poll", "ui-rr"} {
		for _, id := range burstTasks {
			ag.waitFor(ui+" completed "+id, 10*time.Second, statusIs(ui, id, "completed"))
		}
	}
	if tr := ag.transport("ui-rr"); tr != "websocket" {
		t.Fatalf("the UI behind the round-robin balancer did not upgrade: %s", tr)
	}
	for _, ui := range []string{"ui-rr-poll", "ui-rr", "ui-sticky-poll"} {
		ag.close(ui)
	}

	// claimRunning claims a task for worker sock through node via and starts it.
	claimRunning := func(sock, via string) string {
		t.Helper()
		id := submit(t, base(S), token, room, job)
		st, _, c := call(t, "POST", base(via)+"/tasks/claim", token, map[string]any{"worker_id": workers[sock]})
		tk, _ := c["task"].(map[string]any)
		if st != 200 || tk == nil || tk["id"] != id {
			t.Fatalf("claim for %s: %d %v (want %s)", sock, st, c, id)
		}
		if st, _, b := call(t, "PATCH", base(via)+"/tasks/"+id, token, map[string]any{"status": "running"}); st != 200 {
			t.Fatalf("running: %d %v", st, b)
		}
		ag.waitFor("running "+id, 5*time.Second, statusIs("ui-"+S, id, "running"))
		return id
	}

	// A node killed mid-task.
	lostTask := claimRunning("w-"+N, S)
	movedTask := claimRunning("w2-"+N, S)
	killedN := time.Now()
	kill(t, nodes[N])
	// The second worker reconnects to S within the grace window.
	bindWorker("w2-"+N+"-moved", S, workers["w2-"+N])
	failed := ag.waitFor("lost node's task failed", 15*time.Second, statusIs("ui-"+S, lostTask, "failed"))
	nodeLossTook := failed.At.Sub(killedN)
	if e := failed.field("error"); e != "Worker disconnected" {
		t.Fatalf("lost task error %q", e)
	}
	if st, _, tk := call(t, "GET", base(S)+"/tasks/"+movedTask, token, nil); st != 200 || tk["status"] != "running" || tk["worker_id"] != workers["w2-"+N] {
		t.Fatalf("the task of the worker that moved to another node: %d %v", st, tk)
	}

	// The sweeper leader killed mid-task.
	leaderTask := claimRunning("w-"+L, S)
	killedL := time.Now()
	kill(t, nodes[L])
	failed = ag.waitFor("leader's task failed", 15*time.Second, statusIs("ui-"+S, leaderTask, "failed"))
	leaderLossTook := failed.At.Sub(killedL)
	if got := waitLeader(t, map[string]*proc{S: nodes[S]}); got != S {
		t.Fatalf("leader %s", got)
	}

	// N restarted with its node id: UIs and workers on it work again.
	restarted := time.Now()
	nodes[N] = startServe(t, env(N)...)
	restartTook := time.Since(restarted)
	ag.connect("ui2-"+N, sio(N), token)
	ag.emit("ui2-"+N, "join_room", map[string]any{"room_id": room})
	bindWorker("w3-"+N, N, newWorker(N))
	last := submit(t, base(S), token, room, job)
	ag.waitFor("task_available on the restarted node", 5*time.Second, func(e agentEvent) bool {
		return e.Sock == "w3-"+N && e.Event == "task_available" && e.field("task_id") == last
	})
	st, _, c := call(t, "POST", base(N)+"/tasks/claim", token, map[string]any{"worker_id": workers["w3-"+N]})
	if tk, _ := c["task"].(map[string]any); st != 200 || tk == nil || tk["id"] != last {
		t.Fatalf("claim on the restarted node: %d %v", st, c)
	}
	for _, s := range []string{"running", "completed"} {
		if st, _, b := call(t, "PATCH", base(N)+"/tasks/"+last, token, map[string]any{"status": s}); st != 200 {
			t.Fatalf("%s: %d %v", s, st, b)
		}
	}
	ag.waitFor("restarted node's UI sees completion", 5*time.Second, statusIs("ui2-"+N, last, "completed"))
	// The restarted node's recovery (after its grace) spares the worker
	// that moved to S; it then completes its task.
	waitLog(t, nodes[N], "startup recovery done", 10*time.Second)
	if st, _, b := call(t, "PATCH", base(S)+"/tasks/"+movedTask, token, map[string]any{"status": "completed"}); st != 200 {
		t.Fatalf("moved worker completes its task: %d %v", st, b)
	}
	ag.waitFor("moved task completed", 5*time.Second, statusIs("ui-"+S, movedTask, "completed"))
	ag.waitFor("moved task completed on the restarted node", 5*time.Second, statusIs("ui2-"+N, movedTask, "completed"))

	// Exact accounting: every (task, status) event at most once on every
	// socket; all of them on the UI that lived throughout.
	want := map[string][]string{lostTask: {"pending", "claimed", "running", "failed"}, movedTask: {"pending", "claimed", "running", "completed"},
		leaderTask: {"pending", "claimed", "running", "failed"}, last: {"pending", "claimed", "running", "completed"}}
	for _, id := range burstTasks {
		want[id] = []string{"pending", "claimed", "running", "completed"}
	}
	exactly := func(ui string, tasks []string) {
		t.Helper()
		got := map[string]int{}
		for _, e := range ag.received(ui) {
			if e.Event == "task_status_event" {
				got[e.field("id")+" "+e.field("status")]++
			}
		}
		for k, n := range got {
			if n != 1 {
				t.Errorf("%s received %q %d times", ui, k, n)
			}
		}
		for _, id := range tasks {
			for _, s := range want[id] {
				if got[id+" "+s] != 1 {
					t.Errorf("%s received %s %s %d times, want once", ui, id, s, got[id+" "+s])
				}
			}
		}
	}
	exactly("ui-"+S, slices.Concat(burstTasks, []string{lostTask, movedTask, leaderTask, last}))
	exactly("ui-"+N, burstTasks)
	exactly("ui-"+L, burstTasks)
	exactly("ui2-"+N, []string{last})
	exactly("ui-rr-poll", burstTasks)
	exactly("ui-rr", burstTasks)
	for _, ui := range []string{"ui-rr-poll", "ui-rr"} {
		for _, e := range ag.received(ui) {
			if e.Event == "$disconnect" && e.Reason != "io client disconnect" {
				t.Errorf("%s behind the round-robin balancer was disconnected: %s", ui, e.Reason)
			}
		}
	}
	for sock := range workers {
		seen := map[string]int{}
		for _, e := range ag.received(sock) {
			if e.Event == "task_available" {
				seen[e.field("task_id")]++
			}
		}
		for id, n := range seen {
			if n != 1 {
				t.Errorf("%s received task_available %s %d times", sock, id, n)
			}
		}
		if strings.HasPrefix(sock, "w-") || sock == "w2-"+N {
			for _, id := range burstTasks {
				if seen[id] != 1 {
					t.Errorf("%s received task_available %s %d times, want once", sock, id, seen[id])
				}
			}
		}
	}

	// The audit trail names the path: node loss, not the sweeper.
	db, err := models.Open(t.Context(), dbURL, models.OpenOptions{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, sock := range []string{"w-" + N, "w-" + L} {
		wid := uuid.MustParse(workers[sock])
		es, err := db.Q(t.Context()).ListCleanupEvents(models.CleanupEventFilter{WorkerID: &wid}, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(es) != 1 || es[0].Path != "node" {
			t.Errorf("cleanup of %s: %+v", sock, es)
		}
	}
	t.Logf("bus gaps seen by the surviving node: %s", metricLines(t, nodes[S], "joblib_bus_gaps_total{"))
	t.Logf("timings: 3 nodes started together on an empty database in %s; node SIGKILLed -> task failed in %s; leader SIGKILLed -> task failed in %s; restart to listening %s; polling emit+ack through a round-robin balancer %.2f ms vs one node %.2f ms (%.2fx); whole test %s",
		startedIn.Round(time.Millisecond), nodeLossTook.Round(time.Millisecond), leaderLossTook.Round(time.Millisecond),
		restartTook.Round(time.Millisecond), viaRR/hops, viaSticky/hops, viaRR/viaSticky, time.Since(began).Round(time.Millisecond))
}

func statusIs(sock, id, status string) func(agentEvent) bool {
	return func(e agentEvent) bool {
		return e.Sock == sock && e.Event == "task_status_event" && e.field("id") == id && e.field("status") == status
	}
}

func submit(t *testing.T, base, token, room, job string) string {
	t.Helper()
	st, _, task := call(t, "POST", base+"/rooms/"+room+"/tasks/"+job, token, map[string]any{"payload": map[string]any{}})
	if st != 202 {
		t.Fatalf("submit: %d %v", st, task)
	}
	return task["id"].(string)
}

func kill(t *testing.T, p *proc) {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.done
}

// waitLeader returns the one node whose metrics say it is the sweeper.
func waitLeader(t *testing.T, nodes map[string]*proc) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var leaders []string
		for name, p := range nodes {
			res, err := http.Get("http://" + p.addr + "/metrics")
			if err != nil {
				continue
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if strings.Contains(string(body), "\njoblib_sweeper_leader 1\n") {
				leaders = append(leaders, name)
			}
		}
		if len(leaders) == 1 {
			return leaders[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no single sweeper leader among %d nodes: %v", len(nodes), leaders)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitLog waits until the process has logged msg.
func waitLog(t *testing.T, p *proc, msg string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(p.stderr.String(), fmt.Sprintf("msg=%q", msg)) && !strings.Contains(p.stderr.String(), "msg="+msg) {
		if time.Now().After(deadline) {
			t.Fatalf("%q not logged within %s:\n%s", msg, timeout, p.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// roundRobin is a load balancer without stickiness for the test: every
// request (polling GETs and POSTs, websocket upgrades) goes to the next
// backend in turn. It returns its URL.
func roundRobin(t *testing.T, backends ...string) string {
	t.Helper()
	var n atomic.Uint64
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			b := backends[(n.Add(1)-1)%uint64(len(backends))]
			pr.SetURL(&url.URL{Scheme: "http", Host: b})
		},
		FlushInterval: -1,
	}
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	return srv.URL
}

// metricLines returns the node's metric lines that start with prefix.
func metricLines(t *testing.T, p *proc, prefix string) string {
	t.Helper()
	res, err := http.Get("http://" + p.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	var out []string
	for _, l := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "; ")
}
