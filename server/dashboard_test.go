package server_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/internal/syncbuf"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
)

// dashFixture: alice's worker serves r:modifiers:Echo and holds a running
// task; another task of the job failed, a third is pending.
type dashFixture struct {
	worker, running, failed, pending string
}

func newDashFixture(t *testing.T, e *env) dashFixture {
	t.Helper()
	var f dashFixture
	f.worker = e.newWorker(e.alice)
	e.do(e.alice, "PUT", api+"/rooms/r/jobs", map[string]any{"category": "modifiers", "name": "Echo", "schema": map[string]any{}, "worker_id": f.worker}).want(201)
	submit := func() string {
		return e.do(e.bob, "POST", api+"/rooms/r/tasks/r:modifiers:Echo", map[string]any{"payload": map[string]any{}}).want(202).M()["id"].(string)
	}
	claim := func() string {
		return e.do(e.alice, "POST", api+"/tasks/claim", map[string]any{"worker_id": f.worker}).want(200).M()["task"].(map[string]any)["id"].(string)
	}
	submit()
	f.failed = claim()
	e.do(e.alice, "PATCH", api+"/tasks/"+f.failed, map[string]any{"status": "running"}).want(200)
	e.do(e.alice, "PATCH", api+"/tasks/"+f.failed, map[string]any{"status": "failed", "error": "boom"}).want(200)
	submit()
	f.running = claim()
	e.do(e.alice, "PATCH", api+"/tasks/"+f.running, map[string]any{"status": "running"}).want(200)
	f.pending = submit()
	return f
}

func auditOf(t *testing.T, e *env, action string) []joblib.AuditEntry {
	t.Helper()
	es, err := e.svc.ListAudit(context.Background(), action, 100)
	if err != nil {
		t.Fatal(err)
	}
	return es
}

// The snapshot and every operator action are for superusers: without a
// token 401, a regular user's token 403 problem+json, and nothing changes.
func TestDashboardSuperuserOnly(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		f := newDashFixture(t, e)
		calls := []struct{ method, path string }{
			{"GET", api + "/dashboard"},
			{"POST", api + "/dashboard/tasks/" + f.failed + "/retry"},
			{"POST", api + "/dashboard/tasks/" + f.pending + "/cancel"},
			{"DELETE", api + "/dashboard/workers/" + f.worker},
		}
		for _, c := range calls {
			e.do("", c.method, c.path, nil).problem(401, "unauthorized")
			m := e.do(e.alice, c.method, c.path, nil).problem(403, "forbidden")
			if m["detail"] != "The dashboard shows every user's workers and tasks: it is for superusers only" {
				t.Errorf("%s %s: detail %v", c.method, c.path, m["detail"])
			}
		}
		for id, want := range map[string]string{f.failed: "failed", f.pending: "pending", f.running: "running"} {
			if got := e.getTask(id)["status"]; got != want {
				t.Errorf("task %s: status %v after refused actions, want %s", id, got, want)
			}
		}
		e.do(e.alice, "PATCH", api+"/workers/"+f.worker, nil).want(200) // still there
		for _, a := range []string{joblib.AuditTaskRetry, joblib.AuditTaskCancel, joblib.AuditWorkerOperatorDelete} {
			if es := auditOf(t, e, a); len(es) != 0 {
				t.Errorf("refused actions audited: %+v", es)
			}
		}
	})
}

// Retry a failed task, cancel a pending one, delete a worker: each answers
// the new state, publishes it, and leaves an audit row naming the operator.
func TestDashboardActions(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		logs := &syncbuf.Buffer{}
		e := setup(t, db, func(o *setupOpts) { o.logger = slog.New(slog.NewJSONHandler(logs, nil)) })
		f := newDashFixture(t, e)
		admin := "dashboard:admin"
		defer func() {
			// One log line per action that went through, naming the actor.
			n := 0
			for _, l := range strings.Split(logs.String(), "\n") {
				var m map[string]any
				if json.Unmarshal([]byte(l), &m) != nil || m["msg"] != "operator action" {
					continue
				}
				n++
				if m["actor"] != "admin" || m["target"] == nil || m["action"] == nil {
					t.Errorf("operator action log line %s", l)
				}
			}
			if n != 3 {
				t.Errorf("%d operator action log lines, want 3 (retry, cancel, delete)", n)
			}
		}()

		// Retry: failed -> pending, attempt kept; only failed tasks.
		r := e.do(e.admin, "POST", api+"/dashboard/tasks/"+f.failed+"/retry", nil).want(200).M()
		if r["status"] != "pending" || r["attempt"] != float64(1) {
			t.Fatalf("retry answered %v", r)
		}
		e.do(e.admin, "POST", api+"/dashboard/tasks/"+f.running+"/retry", nil).problem(409, "invalid-task-transition")
		if es := auditOf(t, e, joblib.AuditTaskRetry); len(es) != 1 || es[0].Actor != admin || es[0].SubjectID.String() != f.failed {
			t.Fatalf("retry audit %+v", es)
		}

		// Cancel: pending -> cancelled with the operator's reason; a task
		// already finished is refused. (A held task's cancel, which reaches
		// its worker: TestCancelReachesTheHoldingWorker.)
		c := e.do(e.admin, "POST", api+"/dashboard/tasks/"+f.pending+"/cancel", nil).want(200).M()
		if c["status"] != "cancelled" || c["error"] != joblib.ErrCancelledByOperator {
			t.Fatalf("cancel answered %v", c)
		}
		e.do(e.admin, "POST", api+"/dashboard/tasks/"+f.pending+"/cancel", nil).problem(409, "invalid-task-transition")
		e.do(e.admin, "POST", api+"/dashboard/tasks/"+uuid.NewString()+"/cancel", nil).problem(404, "task-not-found")
		e.do(e.admin, "POST", api+"/dashboard/tasks/nope/cancel", nil).problem(422, "validation-error")
		if es := auditOf(t, e, joblib.AuditTaskCancel); len(es) != 1 || es[0].Actor != admin || es[0].SubjectID.String() != f.pending {
			t.Fatalf("cancel audit %+v", es)
		}
		if !statusOf(e.rec.take(), f.pending, "cancelled") {
			t.Fatal("no task_status_event for the cancelled task")
		}

		// Delete the worker: through CleanupWorker (its running task fails
		// with the cleanup's error, a cleanup row records it), audited.
		d := e.do(e.admin, "DELETE", api+"/dashboard/workers/"+f.worker, nil).want(200).M()
		if d["worker_id"] != f.worker || d["tasks_failed"] != float64(1) {
			t.Fatalf("delete answered %v", d)
		}
		if tk := e.getTask(f.running); tk["status"] != "failed" || tk["error"] != joblib.ErrWorkerDisconnected {
			t.Fatalf("the deleted worker's task: %v", tk)
		}
		if !statusOf(e.rec.take(), f.running, "failed") {
			t.Fatal("no task_status_event for the deleted worker's task")
		}
		wid := uuid.MustParse(f.worker)
		ces, err := e.db.Q(context.Background()).ListCleanupEvents(models.CleanupEventFilter{WorkerID: &wid}, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(ces) != 1 || ces[0].Path != joblib.PathGraceful || ces[0].TasksFailed != 1 {
			t.Fatalf("cleanup rows %+v", ces)
		}
		if es := auditOf(t, e, joblib.AuditWorkerOperatorDelete); len(es) != 1 || es[0].Actor != admin || es[0].SubjectID.String() != f.worker {
			t.Fatalf("delete audit %+v", es)
		}
		e.do(e.admin, "DELETE", api+"/dashboard/workers/"+f.worker, nil).problem(404, "worker-not-found")
		e.do(e.alice, "PATCH", api+"/workers/"+f.worker, nil).problem(404, "worker-not-found")
	})
}

// The snapshot shows the fleet: workers with owner and jobs, rooms with
// their counts, the latest tasks and failures, and a sweeper's cleanup with
// its evidence and the false positive when the reaped worker turns up.
func TestDashboardSnapshot(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		f := newDashFixture(t, e)
		var v server.DashboardView
		e.do(e.admin, "GET", api+"/dashboard", nil).want(200).JSON(&v)
		if len(v.Workers) != 1 || v.Workers[0].ID.String() != f.worker || v.Workers[0].Owner != "alice" ||
			len(v.Workers[0].Jobs) != 1 || v.Workers[0].Jobs[0] != "r:modifiers:Echo" || v.Workers[0].ActiveTasks != 1 {
			t.Fatalf("workers %+v", v.Workers)
		}
		if len(v.Rooms) != 1 || v.Rooms[0].RoomID != "r" || v.Rooms[0].Jobs != 1 || v.Rooms[0].Workers != 1 ||
			v.Rooms[0].Tasks["pending"] != 1 || v.Rooms[0].Tasks["running"] != 1 || v.Rooms[0].Tasks["failed"] != 1 {
			t.Fatalf("rooms %+v", v.Rooms)
		}
		if len(v.Jobs) != 1 || v.Jobs[0].Pending != 1 || v.Jobs[0].Active != 1 || v.Jobs[0].Workers != 1 {
			t.Fatalf("jobs %+v", v.Jobs)
		}
		if len(v.LatestTasks) != 3 || v.LatestTasks[0].ID.String() != f.pending || len(v.FailedTasks) != 1 ||
			v.FailedTasks[0].Error == nil || *v.FailedTasks[0].Error != "boom" || string(v.LatestTasks[0].Payload) != "null" {
			t.Fatalf("tasks %+v / failed %+v", v.LatestTasks, v.FailedTasks)
		}
		if v.Totals.Workers != 1 || v.Totals.Tasks["pending"] != 1 || v.Totals.Tasks["failed"] != 1 || v.DBNow.IsZero() {
			t.Fatalf("totals %+v at %v", v.Totals, v.DBNow)
		}

		// Reap the worker as the sweeper would: its heartbeat 90 s old.
		ctx := context.Background()
		if err := e.db.Q(ctx).SetHeartbeatAge([]uuid.UUID{uuid.MustParse(f.worker)}, 90*time.Second); err != nil {
			t.Fatal(err)
		}
		rep, err := e.svc.Sweep(ctx, joblib.SweepParams{Threshold: time.Minute})
		if err != nil || rep.Result.Cleaned != 1 {
			t.Fatalf("sweep: %+v %v", rep.Result, err)
		}
		// Its owner heartbeats it again: a false positive.
		e.do(e.alice, "PATCH", api+"/workers/"+f.worker, nil).problem(404, "worker-not-found")
		v = server.DashboardView{}
		e.do(e.admin, "GET", api+"/dashboard", nil).want(200).JSON(&v)
		if len(v.Workers) != 0 || len(v.Cleanups) != 1 {
			t.Fatalf("after the sweep: workers %+v cleanups %+v", v.Workers, v.Cleanups)
		}
		c := v.Cleanups[0]
		if c.Path != joblib.PathSweeper || c.WorkerID.String() != f.worker || c.Owner != "alice" || c.TasksFailed != 1 ||
			c.ThresholdMs == nil || *c.ThresholdMs != 60000 || c.SilenceMs == nil || *c.SilenceMs < 90000 || *c.SilenceMs > 120000 ||
			c.DBNow.Sub(c.LastHeartbeat.Time) != time.Duration(*c.SilenceMs)*time.Millisecond {
			t.Fatalf("cleanup evidence %+v (threshold %v, silence %v)", c, deref(c.ThresholdMs), deref(c.SilenceMs))
		}
		if c.HeardAt.IsZero() || c.HeardVia == nil || *c.HeardVia != joblib.HeardViaHeartbeat {
			t.Fatalf("false positive not shown: %+v", c)
		}
		if v.Totals.FalsePositives != 1 || len(v.FalsePositives) != 1 || v.CleanupCounts[joblib.PathSweeper] != 1 {
			t.Fatalf("false positives %d %+v, counts %v", v.Totals.FalsePositives, v.FalsePositives, v.CleanupCounts)
		}
	})
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// The dashboard channel: a superuser's socket joins and gets a snapshot in
// the ack; a burst of changes is coalesced into a few dashboard_update
// pushes (at most one per 250 ms), the last of which shows everything.
// Regular users and anonymous sockets cannot join.
func TestDashboardChannel(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		e := setup(t, db, withRealtime(server.DefaultRealtimeConfig()))
		w := e.newWorker(e.alice)
		e.do(e.alice, "PUT", api+"/rooms/r/jobs", map[string]any{"category": "modifiers", "name": "Echo", "schema": map[string]any{}, "worker_id": w}).want(201)

		a := mustDialSIO(t, e.url, e.alice)
		if ack := a.call("join_dashboard", map[string]any{}); ack["ok"] == true || ack["status"] != float64(403) || ack["dashboard"] != nil {
			t.Fatalf("alice joined the dashboard: %v", ack)
		}
		s := mustDialSIO(t, e.url, e.admin)
		ack := s.call("join_dashboard", map[string]any{})
		d, _ := ack["dashboard"].(map[string]any)
		if ack["ok"] != true || d == nil || len(d["workers"].([]any)) != 1 {
			t.Fatalf("join_dashboard ack %v", ack)
		}

		const burst = 40
		start := time.Now()
		for i := range burst {
			e.do(e.bob, "POST", api+"/rooms/r/tasks/r:modifiers:Echo", map[string]any{"payload": map[string]any{"i": i}}).want(202)
		}
		s.waitEvent("dashboard_update", 10*time.Second, func(p map[string]any) bool {
			tasks, _ := p["totals"].(map[string]any)["tasks"].(map[string]any)
			return tasks["pending"] == float64(burst)
		})
		elapsed := time.Since(start)
		ups := s.eventsNamed("dashboard_update")
		// One per 250 ms at most, plus the one a change right after the
		// join may start at once.
		if most := int(elapsed/(250*time.Millisecond)) + 2; len(ups) > most || len(ups) >= burst {
			t.Fatalf("%d updates for %d changes in %s (at most %d)", len(ups), burst, elapsed, most)
		}
		for i := 1; i < len(ups); i++ {
			if gap := ups[i].At.Sub(ups[i-1].At); gap < 200*time.Millisecond {
				t.Errorf("updates %d and %d only %s apart", i-1, i, gap)
			}
		}
		t.Logf("%d changes in %s: %d pushes", burst, elapsed.Round(time.Millisecond), len(ups))

		// After leave_dashboard, nothing more arrives.
		s.mustCall("leave_dashboard", map[string]any{})
		n := len(s.eventsNamed("dashboard_update"))
		e.do(e.bob, "POST", api+"/rooms/r/tasks/r:modifiers:Echo", map[string]any{"payload": map[string]any{}}).want(202)
		time.Sleep(600 * time.Millisecond)
		if got := len(s.eventsNamed("dashboard_update")); got != n {
			t.Fatalf("%d updates after leaving", got-n)
		}
	})
}

// The page's files are served from the binary at /ui/ with a strict
// Content-Security-Policy; they carry no data (the page asks for a token).
func TestDashboardFiles(t *testing.T) {
	e := setup(t, dbtest.Open(t, models.SQLite))
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := noFollow.Get(e.url + "/ui")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 301 || res.Header.Get("Location") != "/ui/" {
		t.Fatalf("/ui answers %d to %q", res.StatusCode, res.Header.Get("Location"))
	}
	for path, ctype := range map[string]string{"/ui/": "text/html; charset=utf-8", "/ui/app.js": "text/javascript; charset=utf-8",
		"/ui/sio.js": "text/javascript; charset=utf-8", "/ui/app.css": "text/css; charset=utf-8"} {
		r := e.do("", "GET", path, nil).want(200)
		if got := r.Header.Get("Content-Type"); got != ctype {
			t.Errorf("%s: Content-Type %q, want %q", path, got, ctype)
		}
		if csp := r.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("%s: Content-Security-Policy %q", path, csp)
		}
	}
	if body := string(e.do("", "GET", "/ui/", nil).Body); !strings.Contains(body, `id="login-form"`) || strings.Contains(body, "<script>") {
		t.Errorf("index.html: %s", body)
	}
	e.do("", "GET", "/ui/nope.js", nil).problem(404, "not-found")
}
