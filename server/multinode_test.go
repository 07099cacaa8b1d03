package server_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/zndraw/joblib/server"

	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// twoNodes starts two API nodes on one PostgreSQL schema, each with its own
// pool and NOTIFY bus, sharing users and tokens.
func twoNodes(t *testing.T, opts ...func(*setupOpts)) (a, b *env) {
	t.Helper()
	url := dbtest.URL(t, models.Postgres)
	node := func(name string) (*models.DB, *events.PGBus) { return pgNode(t, url, name) }
	dbA, busA := node("a")
	dbB, busB := node("b")
	a = setup(t, dbA, append([]func(*setupOpts){withBus(busA), withRealtime(realtimeCfg())}, opts...)...)
	// The second node shares the first node's users: reuse its tokens.
	return a, setupShared(t, dbB, busB, a, opts...)
}

// setupShared is setup for a node whose users already exist.
func setupShared(t *testing.T, db *models.DB, bus events.Bus, first *env, opts ...func(*setupOpts)) *env {
	t.Helper()
	e := setupNoUsers(t, db, append([]func(*setupOpts){withBus(bus), withRealtime(realtimeCfg())}, opts...)...)
	e.admin, e.alice, e.bob = first.admin, first.alice, first.bob
	return e
}

// TestTwoNodesShareEvents: a long-poll on node B is woken by a completion on
// node A, and a UI connected to node B receives node A's events.
func TestTwoNodesShareEvents(t *testing.T) {
	t.Parallel()
	a, b := twoNodes(t)
	wid := a.registerJob(a.alice, "mn", "modifiers", "Job")["worker_id"].(string)
	ui := mustDialSIO(t, b.url, b.bob)
	ui.mustCall("join_room", map[string]any{"room_id": "mn"})

	id := a.submit(a.bob, "mn", "mn:modifiers:Job", nil)
	ui.waitEvent("task_status_event", 3*time.Second, func(p map[string]any) bool { return p["id"] == id && p["status"] == "pending" })
	a.claim(a.alice, wid)
	a.patch(a.alice, id, "running").want(200)

	done := make(chan resp, 1)
	go func() { done <- b.do(b.alice, "GET", api+"/tasks/"+id, nil, "Prefer: wait=10") }()
	time.Sleep(200 * time.Millisecond)
	a.patch(a.alice, id, "completed").want(200)
	completed := time.Now()
	select {
	case r := <-done:
		if r.want(200).M()["status"] != "completed" {
			t.Fatalf("long-poll on node B saw %s", r.Body)
		}
		if lag := time.Since(completed); lag > time.Second {
			t.Fatalf("node B's long-poll woke %s after node A's completion", lag)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("node B's long-poll was not woken by node A's completion")
	}
	ui.waitEvent("task_status_event", 3*time.Second, func(p map[string]any) bool { return p["id"] == id && p["status"] == "completed" })
}

// The events the one-statement paths build in SQL for other nodes are the
// events this node delivers: a UI on node B receives, for a task submitted,
// claimed, run and failed through node A, exactly the payloads a UI on node A
// receives, and node B's worker socket gets task_available.
func TestTwoNodesHotEventsMatch(t *testing.T) {
	t.Parallel()
	for _, after := range []bool{false, true} {
		t.Run(fmt.Sprintf("notify-after-commit=%v", after), func(t *testing.T) {
			t.Parallel()
			a, b := twoNodes(t, withSettings(func(s *joblib.Settings) { s.NotifyAfterCommit = after }))
			testTwoNodesHotEventsMatch(t, a, b)
		})
	}
}

func testTwoNodesHotEventsMatch(t *testing.T, a, b *env) {
	wid := a.registerJob(a.alice, "hm", "modifiers", "Job")["worker_id"].(string)
	uiA, uiB := mustDialSIO(t, a.url, a.bob), mustDialSIO(t, b.url, b.bob)
	uiA.mustCall("join_room", map[string]any{"room_id": "hm"})
	uiB.mustCall("join_room", map[string]any{"room_id": "hm"})
	w := mustDialSIO(t, b.url, b.alice)
	w.mustCall("join_job_room", map[string]any{"job_name": "hm:modifiers:Job", "worker_id": wid})

	a.submit(a.bob, "hm", "hm:modifiers:Job", nil)
	id := a.submit(a.bob, "hm", "hm:modifiers:Job", nil)
	av := w.waitEvent("task_available", 3*time.Second, func(p map[string]any) bool { return p["task_id"] == id })
	if av.Payload["job_name"] != "hm:modifiers:Job" || av.Payload["room_id"] != "hm" {
		t.Fatalf("task_available on node B: %v", av.Payload)
	}
	a.claim(a.alice, wid)
	a.claim(a.alice, wid)
	a.patch(a.alice, id, "running").want(200)
	a.do(a.alice, "PATCH", api+"/tasks/"+id, map[string]any{"status": "failed", "error": "boom \"quoted\" ünïcode"}).want(200)
	for _, status := range []string{"pending", "claimed", "running", "failed"} {
		match := func(p map[string]any) bool { return p["id"] == id && p["status"] == status }
		pa := uiA.waitEvent("task_status_event", 3*time.Second, match).Payload
		pb := uiB.waitEvent("task_status_event", 3*time.Second, match).Payload
		if fmt.Sprint(pa) != fmt.Sprint(pb) {
			t.Fatalf("%s event differs between nodes:\nA %v\nB %v", status, pa, pb)
		}
	}
}

// TestBusGapInvalidatesAndWakes: node B's LISTEN connection dies and a task
// completes on node A meanwhile (its NOTIFY never reaches B). When B listens
// again it reports the gap: its UI rooms get jobs_invalidate,
// providers_invalidate and tasks_invalidate, a long-poll on B re-reads its
// row and answers "completed" without waiting out its wait, and the gap is
// counted in joblib_bus_gaps_total.
func TestBusGapInvalidatesAndWakes(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t, models.Postgres)
	ctx := context.Background()
	node := func(name string) (*models.DB, *events.PGBus) { return pgNode(t, url, name) }
	dbA, busA := node("gap-a")
	dbB, busB := node("gap-b")
	a := setup(t, dbA, withBus(busA), withRealtime(realtimeCfg()))
	b := setupShared(t, dbB, busB, a)
	m, err := server.NewMetrics(prometheus.NewRegistry(), b.svc)
	if err != nil {
		t.Fatal(err)
	}

	wid := a.registerJob(a.alice, "gp", "modifiers", "Job")["worker_id"].(string)
	id := a.submit(a.bob, "gp", "gp:modifiers:Job", nil)
	a.claim(a.alice, wid)
	a.patch(a.alice, id, "running").want(200)
	ui := mustDialSIO(t, b.url, b.bob)
	ui.mustCall("join_room", map[string]any{"room_id": "gp"})

	done := make(chan resp, 1)
	go func() { done <- b.do(b.alice, "GET", api+"/tasks/"+id, nil, "Prefer: wait=20") }()
	time.Sleep(200 * time.Millisecond) // the long-poll is waiting
	if _, err := dbA.Pool.Exec(ctx, "SELECT pg_terminate_backend($1)", busB.ListenerPID()); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	a.patch(a.alice, id, "completed").want(200)
	completed := time.Now()
	select {
	case r := <-done:
		if r.want(200).M()["status"] != "completed" {
			t.Fatalf("long-poll on node B answered %s", r.Body)
		}
		if d := time.Since(completed); d > 10*time.Second {
			t.Fatalf("long-poll answered %s after the completion: not woken by the gap", d)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("long-poll on node B not woken after the bus gap")
	}
	for _, ev := range []string{"jobs_invalidate", "providers_invalidate", "tasks_invalidate"} {
		ui.waitEvent(ev, 5*time.Second, func(map[string]any) bool { return true })
	}
	t.Logf("LISTEN connection terminated -> UI invalidated (delivery resumed) in %s", time.Since(killed).Round(time.Millisecond))
	if got := testCounter(t, m.BusGaps.WithLabelValues(events.GapReconnect)); got < 1 {
		t.Fatalf("joblib_bus_gaps_total{reason=reconnect} = %v", got)
	}
}

// pgNode opens one API node's database pool on the schema at url (migrated)
// and starts its NOTIFY bus; both are closed when the test ends.
func pgNode(t *testing.T, url, name string) (*models.DB, *events.PGBus) {
	t.Helper()
	return dbtest.Node(t, url, name)
}

// TestTwoNodesDeliverInCommitOrder: submits on one node racing claims and
// status changes on the other, from several clients at once. Both nodes
// deliver every event in the same order, and each task's status events in
// the order of its transitions (before, the submitting node delivered its
// own events right after commit, which a claim committed just after could
// overtake).
func TestTwoNodesDeliverInCommitOrder(t *testing.T) {
	t.Parallel()
	a, b := twoNodes(t)
	wid := a.registerJob(a.alice, "co", "modifiers", "Job")["worker_id"].(string)
	a.rec.take()
	b.rec.take()
	const clients, perClient = 4, 8
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for range perClient {
				a.submit(a.bob, "co", "co:modifiers:Job", nil)
				task := b.claim(b.alice, wid)
				if task == nil {
					continue // another client claimed it; it moves that one on
				}
				id := task["id"].(string)
				if r := a.patch(a.alice, id, "running"); r.Status != 200 {
					t.Errorf("running %s on node A: %d %s", id, r.Status, r.Body)
				}
				if r := b.patch(b.alice, id, "completed"); r.Status != 200 {
					t.Errorf("completed %s on node B: %d %s", id, r.Status, r.Body)
				}
			}
		})
	}
	wg.Wait()
	for range clients * perClient { // whatever is left pending
		task := a.claim(a.alice, wid)
		if task == nil {
			break
		}
		a.patch(a.alice, task["id"].(string), "running").want(200)
		a.patch(a.alice, task["id"].(string), "completed").want(200)
	}
	if t.Failed() {
		t.FailNow()
	}
	statuses := func(node string, e *env) []events.Emission {
		var got []events.Emission
		n := 0
		for deadline := time.Now().Add(20 * time.Second); n < clients*perClient; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("node %s delivered %d of %d completions in 20 s (%d status events)", node, n, clients*perClient, len(got))
			}
			for _, em := range of(e.rec.take(), "task_status_event") {
				got = append(got, em)
				if em.Event.(events.TaskStatusEvent).Status == "completed" {
					n++
				}
			}
		}
		return got
	}
	onA, onB := statuses("A", a), statuses("B", b)
	if len(onA) != len(onB) {
		t.Fatalf("node A delivered %d status events, node B %d", len(onA), len(onB))
	}
	rank := map[string]int{"pending": 0, "claimed": 1, "running": 2, "completed": 3}
	last := map[string]int{}
	for i := range onA {
		ea, eb := onA[i].Event.(events.TaskStatusEvent), onB[i].Event.(events.TaskStatusEvent)
		if ea.ID != eb.ID || ea.Status != eb.Status || onA[i].Offset != onB[i].Offset {
			t.Fatalf("#%d: node A delivered %s %s (%s), node B %s %s (%s)", i, ea.ID, ea.Status, onA[i].Offset, eb.ID, eb.Status, onB[i].Offset)
		}
		r, seen := last[ea.ID]
		if seen && rank[ea.Status] <= r {
			t.Fatalf("task %s: %s delivered after %s", ea.ID, ea.Status, []string{"pending", "claimed", "running", "completed"}[r])
		}
		last[ea.ID] = rank[ea.Status]
	}
}
