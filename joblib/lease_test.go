package joblib_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// A node whose lease lapsed loses its sockets: after the grace window its
// socket-bound workers that did not re-join elsewhere are cleaned with path
// node (tasks failed, events published), its lease row goes; workers that
// re-joined another node, workers of live nodes and REST-only workers stay.
func TestReapLostNodes(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b := setup(t, db)
		j := jobSpec{name: "j"}
		lost, moved, live, rest := b.worker(j), b.worker(j), b.worker(j), b.worker(j)
		b.submit(j)
		task := b.claim(lost)
		q := db.Q(b.ctx)
		b.must(q.AcquireNodeLease("dead-run", "node-x", "10.0.0.9:8080", time.Minute))
		b.must(q.AcquireNodeLease("live-run", "node-y", "10.0.0.8:8080", time.Minute))
		for _, w := range []uuid.UUID{lost, moved} {
			_, err := q.BindWorker(w, "node-x", "dead-run")
			b.must(err)
		}
		_, err := q.BindWorker(moved, "node-y", "live-run") // re-joined elsewhere
		b.must(err)
		_, err = q.BindWorker(live, "node-y", "live-run")
		b.must(err)

		// A live lease is never reaped.
		res, err := b.svc.ReapLostNodes(b.ctx, 0, joblib.LeaderFence{})
		b.must(err)
		if len(res.Nodes) != 0 || res.Result.Cleaned != 0 {
			t.Fatalf("reaped live nodes: %+v", res)
		}
		b.must(q.ExpireNodeLease("dead-run"))
		// Inside the grace window nothing happens yet.
		res, err = b.svc.ReapLostNodes(b.ctx, time.Hour, joblib.LeaderFence{})
		b.must(err)
		if len(res.Nodes) != 0 || res.Result.Cleaned != 0 {
			t.Fatalf("reaped within the grace window: %+v", res)
		}
		time.Sleep(5 * time.Millisecond) // the database clock moves past expires_at
		b.rec.take()
		res, err = b.svc.ReapLostNodes(b.ctx, 0, joblib.LeaderFence{})
		b.must(err)
		if len(res.Nodes) != 1 || res.Nodes[0].Run != "dead-run" || res.Result.Cleaned != 1 || res.Result.Workers[0].ID != lost {
			t.Fatalf("reap: %+v", res)
		}
		for _, w := range []uuid.UUID{moved, live, rest} {
			if !b.workerExists(w) {
				t.Fatalf("worker %s cleaned", w)
			}
		}
		if tk := b.task(task); tk.Status != models.StatusFailed {
			t.Fatalf("task of the lost node's worker is %s", tk.Status)
		}
		if es := b.events(lost); len(es) != 1 || es[0].Path != joblib.PathNode {
			t.Fatalf("audit %+v", es)
		}
		if st := statusEvents(b.rec.take())[task.String()]; len(st) != 1 {
			t.Fatalf("status events of the failed task: %+v", st)
		}
		nodes, err := b.svc.Nodes(b.ctx)
		b.must(err)
		if len(nodes) != 1 || nodes[0].Run != "live-run" || !nodes[0].Live || nodes[0].Addr != "10.0.0.8:8080" {
			t.Fatalf("nodes after the reap: %+v", nodes)
		}
		// Nothing left to do: a second pass is a no-op.
		res, err = b.svc.ReapLostNodes(b.ctx, 0, joblib.LeaderFence{})
		b.must(err)
		if len(res.Nodes) != 0 || res.Result.Cleaned != 0 {
			t.Fatalf("second pass: %+v", res)
		}
	})
}

// Lease rows: renewal reports a lease taken away; a new run of the same node
// id ends the earlier runs' leases; startup recovery never touches a run
// whose lease is live.
func TestNodeLeaseLifecycle(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b := setup(t, db)
		q := db.Q(b.ctx)
		b.must(q.AcquireNodeLease("run-1", "node-a", "", time.Minute))
		if ok, err := q.RenewNodeLease("run-1", time.Minute); !ok || err != nil {
			t.Fatalf("renew: %v %v", ok, err)
		}
		if ok, err := q.RenewNodeLease("unknown-run", time.Minute); ok || err != nil {
			t.Fatalf("renew of a missing lease: %v %v", ok, err)
		}
		// A worker of a live run of node-a: recovery by this service (node-a,
		// another run) leaves it alone.
		j := jobSpec{name: "j"}
		w := b.worker(j)
		_, err := q.BindWorker(w, "node-a", "run-1")
		b.must(err)
		res, err := b.svc.RecoverNode(b.ctx)
		b.must(err)
		if res.Cleaned != 0 || !b.workerExists(w) {
			t.Fatalf("recovery touched a live run's worker: %+v", res)
		}
		// A new run of node-a takes over: run-1's lease ends, so recovery
		// now cleans its worker.
		b.must(q.AcquireNodeLease(b.svc.Node().Run, "node-a", "", time.Minute))
		if _, err := q.LiveNode("run-1"); err == nil {
			t.Fatal("run-1 still live after a new run of its node took its lease")
		}
		time.Sleep(5 * time.Millisecond)
		res, err = b.svc.RecoverNode(b.ctx)
		b.must(err)
		if res.Cleaned != 1 || b.workerExists(w) {
			t.Fatalf("recovery after takeover: %+v", res)
		}
		if n, err := q.LiveNode(b.svc.Node().Run); err != nil || n.NodeID != "node-a" {
			t.Fatalf("live node: %+v %v", n, err)
		}
	})
}

// The lease service renews its row, notices when another node took it away
// (OnLost, then a new lease), and ends it at once on Stop.
func TestLeaseServiceRenewsAndNoticesLoss(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b := setup(t, db)
		lost := make(chan struct{}, 1)
		l := b.svc.NewLease(joblib.LeaseConfig{Addr: "10.1.1.1:8080", Timeout: 300 * time.Millisecond, OnLost: func() {
			select {
			case lost <- struct{}{}:
			default:
			}
		}})
		b.must(l.Start(b.ctx))
		run := b.svc.Node().Run
		q := db.Q(b.ctx)
		time.Sleep(600 * time.Millisecond) // two timeouts: only renewals keep it live
		if n, err := q.LiveNode(run); err != nil || n.Addr != "10.1.1.1:8080" {
			t.Fatalf("lease after two timeouts: %+v %v", n, err)
		}
		// Another node judged this one dead and removed its lease.
		b.must(q.DeleteNodeLease(run))
		select {
		case <-lost:
		case <-time.After(5 * time.Second):
			t.Fatal("the lease service did not notice its lease was taken away")
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			if _, err := q.LiveNode(run); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no new lease after the loss")
			}
			time.Sleep(10 * time.Millisecond)
		}
		l.Stop()
		if _, err := q.LiveNode(run); err == nil {
			t.Fatal("lease still live after Stop")
		}
	})
}

// A clean stop ends the lease at INFO, and the release of its sockets that
// follows is not reported as a lost node; a lease left to lapse is.
func TestCleanStopIsNotALostNode(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		var logs syncBuf
		log := slog.New(slog.NewJSONHandler(&logs, nil))
		svc := joblib.New(joblib.Config{DB: db, Logger: log, Node: joblib.Node{ID: "node-s", Run: uuid.NewString()}})
		t.Cleanup(svc.Close)
		ctx := context.Background()
		l := svc.NewLease(joblib.LeaseConfig{Timeout: time.Minute})
		if err := l.Start(ctx); err != nil {
			t.Fatal(err)
		}
		l.Stop()
		if err := db.Q(ctx).AcquireNodeLease("crashed-run", "node-c", "", time.Millisecond); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // the database clock moves past both leases
		res, err := svc.ReapLostNodes(ctx, 0, joblib.LeaderFence{})
		if err != nil || len(res.Nodes) != 2 {
			t.Fatalf("reap: %+v %v", res, err)
		}
		levels := map[string]string{} // run -> level of its reap line
		ended := ""
		for _, line := range strings.Split(logs.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) != nil {
				continue
			}
			msg, _ := m["msg"].(string)
			switch {
			case strings.HasPrefix(msg, "node lease ended"):
				ended, _ = m["level"].(string)
			case strings.HasPrefix(msg, "node lost"), strings.HasPrefix(msg, "node stopped cleanly"):
				levels[m["run"].(string)] = m["level"].(string) + " " + msg
			}
		}
		if ended != "INFO" {
			t.Errorf("clean stop logged its lease end at %q, want INFO:\n%s", ended, logs.String())
		}
		if got := levels[svc.Node().Run]; got != "INFO node stopped cleanly: released its sockets" {
			t.Errorf("reap of the cleanly stopped node: %q", got)
		}
		if got := levels["crashed-run"]; !strings.HasPrefix(got, "WARN node lost") {
			t.Errorf("reap of the crashed node: %q", got)
		}
	})
}

type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
