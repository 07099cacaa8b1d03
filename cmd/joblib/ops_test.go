package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
)

// fixture: two stale workers (one holding a claimed task), one live worker,
// in the database at url.
type fixture struct {
	stale []uuid.UUID
	alive uuid.UUID
	task  uuid.UUID
}

func seed(t *testing.T, url string) fixture {
	t.Helper()
	ctx := context.Background()
	db, err := models.Open(ctx, url, models.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	svc := joblib.New(joblib.Config{DB: db})
	defer svc.Close()
	_, alice, err := svc.CreateToken(ctx, "alice", false)
	if err != nil {
		t.Fatal(err)
	}
	var f fixture
	newWorker := func() uuid.UUID {
		w, err := svc.CreateWorker(ctx, alice)
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = svc.RegisterJob(ctx, alice, "r", joblib.RegisterJobParams{Category: "modifiers", Name: "j", WorkerID: &w.ID})
		if err != nil {
			t.Fatal(err)
		}
		return w.ID
	}
	f.stale = []uuid.UUID{newWorker(), newWorker()}
	f.alive = newWorker()
	tk, err := svc.SubmitTask(ctx, alice, "r", "r:modifiers:j", nil)
	if err != nil {
		t.Fatal(err)
	}
	f.task = tk.ID
	if c, err := svc.ClaimTask(ctx, alice, f.stale[0]); err != nil || c == nil || c.ID != f.task {
		t.Fatalf("claim: %v %v", c, err)
	}
	if err := db.Q(ctx).SetHeartbeatAge(f.stale, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	return f
}

func runCLI(t *testing.T, url string, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	env := map[string]string{"JOBLIB_DATABASE_URL": url, "JOBLIB_LOG_LEVEL": "warn"}
	if err := run(context.Background(), args, env, &out, &errb); err != nil {
		t.Fatalf("joblib %s: %v\n%s", strings.Join(args, " "), err, errb.String())
	}
	return out.String()
}

type state struct {
	Workers int
	Events  int
	Status  string
}

func snapshot(t *testing.T, url string, task uuid.UUID) state {
	t.Helper()
	ctx := context.Background()
	db, err := models.Open(ctx, url, models.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	q := db.Q(ctx)
	_, total, err := q.CountWorkers(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	es, err := q.ListCleanupEvents(models.CleanupEventFilter{}, 100)
	if err != nil {
		t.Fatal(err)
	}
	tk, err := q.GetTask(task)
	if err != nil {
		t.Fatal(err)
	}
	return state{Workers: int(total), Events: len(es), Status: tk.Status}
}

// joblib sweep --json is a dry run that lists exactly the stale workers and
// changes nothing; --fix cleans them with path operator.
func TestSweepCommand(t *testing.T) {
	t.Parallel()
	for _, d := range dbtest.Dialects {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			url := dbtest.URL(t, d)
			f := seed(t, url)
			before := snapshot(t, url, f.task)

			var plan server.SweepView
			raw := runCLI(t, url, "sweep", "--json", "--threshold", "90s")
			if err := json.Unmarshal([]byte(raw), &plan); err != nil {
				t.Fatal(err)
			}
			// JSON for people and jq, not for a web page: ">" stays ">".
			if !strings.Contains(raw, "> threshold 1m30s") || strings.Contains(raw, `\u003e`) {
				t.Fatalf("sweep --json escapes HTML:\n%s", raw)
			}
			// The table names the owner as workers list does.
			if out := runCLI(t, url, "sweep", "--threshold", "90"); !strings.Contains(out, "  alice  ") || strings.Contains(out, plan.Workers[0].UserID.String()) {
				t.Fatalf("sweep table:\n%s", out)
			}
			got := map[uuid.UUID]server.SweepWorker{}
			for _, w := range plan.Workers {
				got[w.ID] = w
			}
			if !plan.DryRun || len(got) != 2 || got[f.stale[0]].ID != f.stale[0] || got[f.stale[1]].ID != f.stale[1] {
				t.Fatalf("plan %+v", plan)
			}
			if w := got[f.stale[0]]; len(w.FailedTasks) != 1 || w.FailedTasks[0] != f.task || w.AgeSeconds < 90 || !strings.Contains(w.Reason, "threshold 1m30s") {
				t.Fatalf("plan for the worker with the task: %+v", w)
			}
			if after := snapshot(t, url, f.task); after != before {
				t.Fatalf("dry run changed the database: %+v -> %+v", before, after)
			}
			// A threshold above the workers' age finds nothing.
			if out := runCLI(t, url, "sweep", "--threshold", "1h"); !strings.Contains(out, "would clean 0 stale worker(s)") {
				t.Fatalf("sweep --threshold 1h: %s", out)
			}

			var done server.SweepView
			if err := json.Unmarshal([]byte(runCLI(t, url, "sweep", "--fix", "--json", "--threshold", "90s")), &done); err != nil {
				t.Fatal(err)
			}
			if done.DryRun || len(done.Workers) != 2 || done.TasksFailed != 1 {
				t.Fatalf("fix %+v", done)
			}
			if after := snapshot(t, url, f.task); after.Workers != 1 || after.Events != 2 || after.Status != models.StatusFailed {
				t.Fatalf("after --fix: %+v", after)
			}

			out := runCLI(t, url, "workers", "list")
			// The owner is shown by name, not by id.
			if !strings.Contains(out, f.alive.String()) || strings.Contains(out, f.stale[0].String()) || !strings.Contains(out, "  alice  ") {
				t.Fatalf("workers list:\n%s", out)
			}
			// jobs list and rooms list, as the dashboard counts them.
			var jobs struct {
				Total int64
				Items []joblib.DashJob
			}
			if err := json.Unmarshal([]byte(runCLI(t, url, "jobs", "list", "--room", "r", "--json")), &jobs); err != nil {
				t.Fatal(err)
			}
			if jobs.Total != 1 || len(jobs.Items) != 1 || jobs.Items[0].FullName != "r:modifiers:j" || jobs.Items[0].Workers != 1 {
				t.Fatalf("jobs list: %+v", jobs)
			}
			if out := runCLI(t, url, "jobs", "list", "--room", "elsewhere"); !strings.Contains(out, "showing 0") {
				t.Fatalf("jobs list of another room:\n%s", out)
			}
			var rooms struct{ Items []joblib.DashRoom }
			if err := json.Unmarshal([]byte(runCLI(t, url, "rooms", "list", "--json")), &rooms); err != nil {
				t.Fatal(err)
			}
			if len(rooms.Items) != 1 || rooms.Items[0].RoomID != "r" || rooms.Items[0].Jobs != 1 || rooms.Items[0].Tasks["failed"] != 1 {
				t.Fatalf("rooms list: %+v", rooms)
			}
			if out := runCLI(t, url, "rooms", "list"); !strings.Contains(out, "1 room(s)") || !strings.Contains(out, "\nr  ") {
				t.Fatalf("rooms list:\n%s", out)
			}
			out = runCLI(t, url, "tasks", "list", "--status", "failed", "--room", "r")
			if !strings.Contains(out, f.task.String()) || !strings.Contains(out, "Worker disconnected") {
				t.Fatalf("tasks list:\n%s", out)
			}
			out = runCLI(t, url, "tasks", "retry", f.task.String(), "--actor", "ops")
			if !strings.Contains(out, "pending again") {
				t.Fatalf("tasks retry: %s", out)
			}
			if s := snapshot(t, url, f.task); s.Status != models.StatusPending {
				t.Fatalf("after retry: %+v", s)
			}
		})
	}
}

// A server killed with SIGKILL and restarted cleans, at start, the workers
// whose sockets its previous run held (path startup); workers bound to
// another node and REST-only workers stay.
func TestServeStartupRecoveryAfterSIGKILL(t *testing.T) {
	t.Parallel()
	bin := joblibBinary(t)
	for _, d := range dbtest.Dialects {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			url := dbtest.URL(t, d)
			serve := func() (*exec.Cmd, string, <-chan struct{}) {
				t.Helper()
				cmd := exec.Command(bin, "serve")
				cmd.Env = append(os.Environ(), "JOBLIB_DATABASE_URL="+url, "JOBLIB_NODE_ID=node-a", "JOBLIB_LISTEN_ADDR=127.0.0.1:0",
					"JOBLIB_LOG_FORMAT=json", "JOBLIB_ADMIN_TOKEN="+testAdminToken, "JOBLIB_DISCONNECT_GRACE=1s")
				stderr, err := cmd.StderrPipe()
				if err != nil {
					t.Fatal(err)
				}
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
				lines := make(chan map[string]any, 64)
				go func() {
					sc := bufio.NewScanner(stderr)
					for sc.Scan() {
						var m map[string]any
						if json.Unmarshal(sc.Bytes(), &m) == nil {
							lines <- m
						}
					}
					close(lines)
					_, _ = io.Copy(io.Discard, stderr)
				}()
				var run string
				deadline := time.After(60 * time.Second)
				for {
					select {
					case m, ok := <-lines:
						if !ok {
							t.Fatal("serve exited")
						}
						if m["msg"] == "node started" {
							run = m["run"].(string)
						}
						if m["msg"] == "listening" {
							if run == "" {
								t.Fatal("listening before the node identified itself")
							}
							recovered := make(chan struct{})
							go func() {
								for m := range lines {
									if m["msg"] == "startup recovery done" {
										close(recovered)
									}
								}
							}()
							return cmd, run, recovered
						}
					case <-deadline:
						t.Fatal("serve did not start")
					}
				}
			}
			first, run1, _ := serve()

			// The socket layer is not merged yet: bind workers as it would.
			ctx := context.Background()
			db, err := models.Open(ctx, url, models.OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			q := db.Q(ctx)
			u, err := q.CreateUser("alice", false)
			if err != nil {
				t.Fatal(err)
			}
			mk := func() uuid.UUID {
				w, err := q.InsertWorker(u.ID)
				if err != nil {
					t.Fatal(err)
				}
				return w.ID
			}
			mine, elsewhere, restOnly, rejoins := mk(), mk(), mk(), mk()
			for _, w := range []uuid.UUID{mine, rejoins} {
				if _, err := q.BindWorker(w, "node-a", run1); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := q.BindWorker(elsewhere, "node-b", "run-b"); err != nil {
				t.Fatal(err)
			}

			if err := first.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_ = first.Wait()
			_, run2, recovered := serve()
			if run2 == run1 {
				t.Fatal("the restart reused the run id")
			}
			// One of the killed run's workers reconnects to the new run within
			// the grace window, as a socket client does after a restart.
			if _, err := q.BindWorker(rejoins, "node-a", run2); err != nil {
				t.Fatal(err)
			}
			// Recovery waits one disconnect grace (1 s here) for sockets to
			// re-attach; the other worker of the killed run did not.
			select {
			case <-recovered:
			case <-time.After(30 * time.Second):
				t.Fatal("no startup recovery after the restart")
			}
			if _, err := q.GetWorker(mine); err != models.ErrNotFound {
				t.Fatalf("worker of the killed run: %v", err)
			}
			for _, w := range []uuid.UUID{elsewhere, restOnly, rejoins} {
				if _, err := q.GetWorker(w); err != nil {
					t.Fatalf("worker %s: %v", w, err)
				}
			}
			es, err := q.ListCleanupEvents(models.CleanupEventFilter{WorkerID: &mine}, 10)
			if err != nil || len(es) != 1 || es[0].Path != joblib.PathStartup {
				t.Fatalf("audit %v %+v", err, es)
			}
		})
	}
}

// joblib tasks prune counts the finished tasks past retention and changes
// nothing; --fix deletes them.
func TestTasksPruneCommand(t *testing.T) {
	t.Parallel()
	for _, d := range dbtest.Dialects {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			url := dbtest.URL(t, d)
			f := seed(t, url)
			ctx := context.Background()
			db, err := models.Open(ctx, url, models.OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			svc := joblib.New(joblib.Config{DB: db})
			defer svc.Close()
			_, alice, err := svc.CreateToken(ctx, "alice", false)
			if err != nil {
				t.Fatal(err)
			}
			old, err := svc.SubmitTask(ctx, alice, "r", "r:modifiers:j", nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := svc.UpdateTask(ctx, alice, old.ID, models.StatusCancelled, nil); err != nil {
				t.Fatal(err)
			}
			// Default retention of cancelled tasks: 24h.
			if err := db.Q(ctx).SetTaskCompletedAge([]uuid.UUID{old.ID, f.task}, 25*time.Hour); err != nil {
				t.Fatal(err)
			}
			exists := func(id uuid.UUID) bool {
				_, err := db.Q(ctx).GetTask(id)
				return err == nil
			}
			out := runCLI(t, url, "tasks", "prune")
			if !strings.Contains(out, "would delete 0 completed, 1 cancelled") || !exists(old.ID) {
				t.Fatalf("tasks prune:\n%s", out)
			}
			var rep struct {
				DryRun bool             `json:"dry_run"`
				Tasks  map[string]int64 `json:"tasks"`
			}
			if err := json.Unmarshal([]byte(runCLI(t, url, "tasks", "prune", "--fix", "--json")), &rep); err != nil {
				t.Fatal(err)
			}
			if rep.DryRun || rep.Tasks[models.StatusCancelled] != 1 || exists(old.ID) || !exists(f.task) {
				t.Fatalf("tasks prune --fix: %+v; the claimed task exists %v", rep, exists(f.task))
			}
		})
	}
}
