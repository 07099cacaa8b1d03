package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// pause stops a process (SIGSTOP) and returns the function that resumes it
// (SIGCONT). The process is resumed at cleanup in any case, so that the
// cleanup's kill ends it.
func pause(t *testing.T, p *proc) (resume func()) {
	t.Helper()
	pid := p.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume = func() {
		if !resumed {
			resumed = true
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(resume)
	return resume
}

// leads reports whether the node's metrics say it is the sweeper.
func leads(p *proc) bool {
	c := http.Client{Timeout: time.Second}
	res, err := c.Get("http://" + p.addr + "/metrics")
	if err != nil {
		return false
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return strings.Contains(string(body), "\njoblib_sweeper_leader 1\n")
}

// restWorkerWithRunningTask registers a REST worker for job r:modifiers:J on
// p and gives it a running task; it returns the task's id and two forms of
// the worker's heartbeat. heartbeat retries once after a 503 with
// Retry-After, as a worker does (a stalled test database may overrun a short
// budget); strict must answer 200 at once.
func restWorkerWithRunningTask(t *testing.T, p *proc, token string) (id string, heartbeat, strict func()) {
	t.Helper()
	base := p.base()
	st, _, w := call(t, "POST", base+"/workers", token, map[string]any{})
	if st != 201 {
		t.Fatalf("create worker: %d %v", st, w)
	}
	wid := w["id"].(string)
	if st, _, b := call(t, "PUT", base+"/rooms/r/jobs", token, map[string]any{"category": "modifiers", "name": "J", "schema": map[string]any{}, "worker_id": wid}); st != 201 {
		t.Fatalf("register job: %d %v", st, b)
	}
	id = submit(t, base, token, "r", "r:modifiers:J")
	if st, _, c := call(t, "POST", base+"/tasks/claim", token, map[string]any{"worker_id": wid}); st != 200 || c["task"] == nil {
		t.Fatalf("claim: %d %v", st, c)
	}
	if st, _, b := call(t, "PATCH", base+"/tasks/"+id, token, map[string]any{"status": "running"}); st != 200 {
		t.Fatalf("running: %d %v", st, b)
	}
	beat := func(retry bool) {
		t.Helper()
		st, h, b := call(t, "PATCH", base+"/workers/"+wid, token, nil)
		if st == 503 && retry && h.Get("Retry-After") != "" {
			t.Logf("heartbeat answered 503 (%v); retrying once", b["type"])
			time.Sleep(time.Second)
			st, _, b = call(t, "PATCH", base+"/workers/"+wid, token, nil)
		}
		if st != 200 {
			t.Fatalf("heartbeat: %d %v\n%s", st, b, p.stderr)
		}
	}
	return id, func() { t.Helper(); beat(true) }, func() { t.Helper(); beat(false) }
}

// faultDuration reads a duration from the environment (bench/faults sets
// the long forms), else def.
func faultDuration(t *testing.T, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return d
}

var stalledFor = regexp.MustCompile(`msg="this node stalled longer than its lease; asking the database before it acts".* stalled_for=(\S+)`)

// TestFaultPausedNodes pauses real `joblib serve` processes on one
// PostgreSQL with SIGSTOP and checks what the fault table of
// docs/architecture.md promises:
//
//   - the sweeper leader paused longer than its lease: the other node leads
//     within the lease timeout plus one probe, and releases the paused
//     node's worker (its running task fails, once);
//   - the paused node resumed: it logs its pause at WARN with its length,
//     does not lead, cleans nothing (no event for the reaped worker comes
//     from it), closes its worker sockets and tells its UI rooms to refetch;
//     every UI sees each task status exactly once;
//   - a node paused for less than its lease: nothing happens (no
//     hand-over, no cleanup, no socket closed, no stall logged).
//
// Lease timeout 3 s, grace 1 s, worker timeout 60 s: only node loss (never
// the heartbeat sweep) can fail a task within the test. (A 2 s lease lapsed
// in CI when the test database stalled for 2 s during the short pause.) The
// leader's pause is 6 s; bench/faults runs the long forms (JOBLIB_FAULT_LEASE,
// JOBLIB_FAULT_PAUSE).
func TestFaultPausedNodes(t *testing.T) {
	t.Parallel()
	joblibBinary(t)
	lease, pauseFor := faultDuration(t, "JOBLIB_FAULT_LEASE", 3*time.Second), faultDuration(t, "JOBLIB_FAULT_PAUSE", 6*time.Second)
	dbURL := dbtest.URL(t, models.Postgres)
	token := "jl_faults_" + uuid.NewString()
	env := func(name string) []string {
		return []string{"JOBLIB_DATABASE_URL=" + dbURL, "JOBLIB_ADMIN_TOKEN=" + token, "JOBLIB_NODE_ID=" + name,
			"JOBLIB_NODE_LEASE_TIMEOUT=" + lease.String(), "JOBLIB_DISCONNECT_GRACE=1s", "JOBLIB_SWEEPER_INTERVAL=1s", "JOBLIB_WORKER_TIMEOUT=60s"}
	}
	nodes := map[string]*proc{"a": launchServe(t, env("a")...), "b": launchServe(t, env("b")...)}
	for _, p := range nodes {
		p.waitListening(t)
	}
	L := waitLeader(t, nodes)
	F := "a"
	if L == "a" {
		F = "b"
	}
	sio := func(n string) string { return "http://" + nodes[n].addr }
	base := func(n string) string { return nodes[n].base() }

	const room = "faults"
	const job = room + ":modifiers:J"
	ag := startAgent(t)
	for _, n := range []string{L, F} {
		ag.connect("ui-"+n, sio(n), token)
		ag.emit("ui-"+n, "join_room", map[string]any{"room_id": room})
	}
	workers := map[string]string{}
	runningTask := func(n string) string {
		t.Helper()
		st, _, w := call(t, "POST", base(n)+"/workers", token, map[string]any{})
		if st != 201 {
			t.Fatalf("create worker: %d %v", st, w)
		}
		wid := w["id"].(string)
		workers[n] = wid
		st, _, body := call(t, "PUT", base(n)+"/rooms/"+room+"/jobs", token, map[string]any{"category": "modifiers", "name": "J", "schema": map[string]any{}, "worker_id": wid})
		if st != 200 && st != 201 {
			t.Fatalf("register job: %d %v", st, body)
		}
		ag.connect("w-"+n, sio(n), token)
		ag.emit("w-"+n, "join_job_room", map[string]any{"job_name": job, "worker_id": wid})
		id := submit(t, base(F), token, room, job)
		st, _, c := call(t, "POST", base(n)+"/tasks/claim", token, map[string]any{"worker_id": wid})
		if tk, _ := c["task"].(map[string]any); st != 200 || tk == nil || tk["id"] != id {
			t.Fatalf("claim: %d %v (want %s)", st, c, id)
		}
		if st, _, b := call(t, "PATCH", base(n)+"/tasks/"+id, token, map[string]any{"status": "running"}); st != 200 {
			t.Fatalf("running: %d %v", st, b)
		}
		ag.waitFor("running "+id, 5*time.Second, statusIs("ui-"+F, id, "running"))
		return id
	}
	taskL, taskF := runningTask(L), runningTask(F)

	// 1. The leader paused well past its lease.
	stopped := time.Now()
	resume := pause(t, nodes[L])
	for !leads(nodes[F]) {
		if time.Since(stopped) > 2*lease+3*time.Second {
			t.Fatalf("%s did not take the leadership over within %s of the leader's SIGSTOP", F, time.Since(stopped))
		}
		time.Sleep(20 * time.Millisecond)
	}
	takeover := time.Since(stopped)
	failed := ag.waitFor("the paused node's task failed", 15*time.Second, statusIs("ui-"+F, taskL, "failed"))
	released := failed.At.Sub(stopped)
	if e := failed.field("error"); e != "Worker disconnected" {
		t.Fatalf("error of the paused node's task: %q", e)
	}
	if d := pauseFor - time.Since(stopped); d > 0 {
		time.Sleep(d)
	}
	pausedFor := time.Since(stopped)
	woke := time.Now()
	resume()

	// 2. Woken: it drops its worker socket, tells its UI room to refetch,
	// logs the pause and does not lead.
	drop := ag.waitFor("the woken node closes its worker socket", 10*time.Second, func(e agentEvent) bool {
		return e.Sock == "w-"+L && e.Event == "$disconnect"
	})
	dropped := drop.At.Sub(woke)
	// (After a pause longer than the ping interval plus the ping timeout,
	// the client or the server may give up on the connection first.)
	if drop.Reason != "io server disconnect" && (pauseFor < 45*time.Second || (drop.Reason != "ping timeout" && drop.Reason != "transport close")) {
		t.Fatalf("worker socket of the woken node closed by %q", drop.Reason)
	}
	ag.waitFor("the woken node's UI told to refetch", 10*time.Second, func(e agentEvent) bool {
		return e.Sock == "ui-"+L && e.Event == "tasks_invalidate" && e.At.After(woke)
	})
	waitLog(t, nodes[L], "this node's lease lapsed (it stalled, or another node judged it dead); dropping its sockets and taking a new lease", 5*time.Second)
	m := stalledFor.FindStringSubmatch(nodes[L].stderr.String())
	if m == nil {
		t.Fatalf("the woken node did not log its stall at WARN:\n%s", nodes[L].stderr)
	}
	if d, err := time.ParseDuration(m[1]); err != nil || d < pausedFor-lease {
		t.Fatalf("stall logged as %q, paused for %s", m[1], pausedFor)
	}
	// The woken node answers requests again, and exactly one node leads.
	if st, _, _ := call(t, "GET", base(L)+"/tasks/"+taskF, token, nil); st != 200 {
		t.Fatalf("the woken node answers %d", st)
	}
	// (The leader gauge follows the sweeper's next interval.)
	for deadline := time.Now().Add(3 * time.Second); leads(nodes[L]); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the woken node still reports leading:\n%s", nodes[L].stderr)
		}
	}
	for range 20 {
		if leads(nodes[L]) || !leads(nodes[F]) {
			t.Fatalf("after the wake: %s leads %v, %s leads %v\n%s", L, leads(nodes[L]), F, leads(nodes[F]), nodes[L].stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// 3. The node now leading paused for a fraction of its lease: nothing
	// visible happens.
	resumeF := pause(t, nodes[F])
	time.Sleep(lease / 4)
	resumeF()
	for range 25 {
		if leads(nodes[L]) {
			t.Fatalf("%s took the leadership over after a pause of %s shorter than the lease", L, lease/4)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if strings.Contains(nodes[F].stderr.String(), "stalled longer than its lease") {
		t.Fatalf("a pause shorter than the lease was reported as a stall:\n%s", nodes[F].stderr)
	}
	for _, e := range ag.received("w-" + F) {
		if e.Event == "$disconnect" {
			t.Fatalf("the worker socket of the node paused briefly closed: %s", e.Reason)
		}
	}
	if st, _, tk := call(t, "GET", base(F)+"/tasks/"+taskF, token, nil); st != 200 || tk["status"] != "running" {
		t.Fatalf("the task of the node paused briefly: %d %v", st, tk)
	}

	// Nothing ended twice, and the woken node cleaned nothing.
	for _, ui := range []string{"ui-" + L, "ui-" + F} {
		n := 0
		for _, e := range ag.received(ui) {
			if e.Event == "task_status_event" && e.field("id") == taskL && e.field("status") == "failed" {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s received the failure of %s %d times", ui, taskL, n)
		}
	}
	for _, msg := range []string{"workers cleaned up", "node lost", "this node is the sweeper"} {
		if strings.Count(nodes[L].stderr.String(), msg) > map[string]int{"this node is the sweeper": 1}[msg] {
			t.Errorf("the woken node logged %q:\n%s", msg, nodes[L].stderr)
		}
	}
	db, err := models.Open(t.Context(), dbURL, models.OpenOptions{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	es, err := db.Q(t.Context()).ListCleanupEvents(models.CleanupEventFilter{}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 1 || es[0].Path != "node" || es[0].WorkerID.String() != workers[L] {
		t.Errorf("cleanups: %+v (want one, path node, of %s)", es, workers[L])
	}
	t.Logf("fault timings: leader SIGSTOP -> other node leads %s (lease %s); SIGSTOP -> paused node's task failed %s; paused %s; SIGCONT -> worker socket dropped %s",
		takeover.Round(time.Millisecond), lease, released.Round(time.Millisecond), pausedFor.Round(time.Millisecond), dropped.Round(time.Millisecond))
}

// TestFaultPausedSQLiteNode pauses a lone `joblib serve` on SQLite for longer
// than the worker timeout. Its workers could not heartbeat through the
// pause; on waking, its leadership lapsed by the database clock, so it
// leads under a new epoch and the sweep guard starts over: a worker that
// heartbeats again right after the pause keeps its running task. (Before
// leadership was a lease, the woken node swept at once and reaped it.)
func TestFaultPausedSQLiteNode(t *testing.T) {
	t.Parallel()
	joblibBinary(t)
	token := "jl_faults_" + uuid.NewString()
	p := startServe(t, "JOBLIB_DATABASE_URL="+filepath.Join(t.TempDir(), "faults.db"), "JOBLIB_ADMIN_TOKEN="+token,
		"JOBLIB_WORKER_TIMEOUT=2s", "JOBLIB_SWEEPER_INTERVAL=1s", "JOBLIB_NODE_LEASE_TIMEOUT=1s")
	base := p.base()
	id, heartbeat, _ := restWorkerWithRunningTask(t, p, token)
	// The node leads (after a jitter of up to 1 s), and its sweep guard (one
	// worker timeout) has passed.
	for end := time.Now().Add(3500 * time.Millisecond); time.Now().Before(end); time.Sleep(300 * time.Millisecond) {
		heartbeat()
	}
	heartbeat()
	resume := pause(t, p)
	time.Sleep(3 * time.Second)
	resume()
	time.Sleep(200 * time.Millisecond) // the client's retry after its request timed out
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(300 * time.Millisecond) {
		heartbeat()
	}
	if st, _, tk := call(t, "GET", base+"/tasks/"+id, token, nil); st != 200 || tk["status"] != "running" {
		t.Fatalf("task of the worker that heartbeated again after the pause: %d %v\n%s", st, tk, p.stderr)
	}
	waitLog(t, p, "this node's leadership lapsed (it stalled) and was taken anew; destructive sweeps wait again", time.Second)
}

// TestFaultKillDuringMigrate: `joblib migrate` on PostgreSQL is SIGKILLed in
// the middle of its migrations (version 1's tables created, its version not
// yet recorded: the test holds a SHARE lock on schema_migrations, so the
// migration waits at its first INSERT there). Nothing of it stays: no
// version is recorded and no table of it exists. Run again, it applies every
// version.
func TestFaultKillDuringMigrate(t *testing.T) {
	t.Parallel()
	joblibBinary(t)
	url := dbtest.URL(t, models.Postgres)
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"); err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE schema_migrations IN SHARE MODE"); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(joblibBinary(t), "migrate")
	cmd.Env = append(hermeticEnv(), "JOBLIB_DATABASE_URL="+url)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The migration is under way once its backend waits for our lock.
	var waiting int
	for deadline := time.Now().Add(20 * time.Second); waiting == 0; time.Sleep(10 * time.Millisecond) {
		err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE relation = 'schema_migrations'::regclass AND NOT granted").Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the migration never reached schema_migrations:\n%s", out.String())
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// The killed process's backend ends its transaction once it finds the
	// connection closed.
	var recorded, tables int
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		err := conn.QueryRow(ctx, "SELECT (SELECT count(*) FROM schema_migrations), (SELECT count(*) FROM pg_tables WHERE schemaname = current_schema() AND tablename <> 'schema_migrations')").Scan(&recorded, &tables)
		if err != nil {
			t.Fatal(err)
		}
		var busy int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE relation = 'schema_migrations'::regclass AND pid <> pg_backend_pid()").Scan(&busy); err != nil {
			t.Fatal(err)
		}
		if busy == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the killed migration's transaction never ended")
		}
	}
	if recorded != 0 || tables != 0 {
		t.Fatalf("after the kill: %d versions recorded, %d tables left", recorded, tables)
	}
	code, stdout, stderr := runBin(t, t.TempDir(), []string{"JOBLIB_DATABASE_URL=" + url}, "migrate")
	if code != 0 {
		t.Fatalf("migrate after the kill: exit %d\n%s%s", code, stdout, stderr)
	}
	db, err := models.Open(ctx, url, models.OpenOptions{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	applied, err := db.Migrate(ctx)
	if err != nil || len(applied) != 0 {
		t.Fatalf("versions left to apply after the second run: %v %v", applied, err)
	}
}

// TestFaultSQLiteDiskFull runs `joblib serve` on SQLite in a 3 MiB tmpfs of
// its own (a private mount namespace, so nothing outlives the process) and
// submits tasks until the disk is full. Writes then answer 503 storage-full
// with Retry-After, reads go on, nothing committed is lost; once the tmpfs
// is grown (space freed), the same process accepts writes again.
func TestFaultSQLiteDiskFull(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("mounting a tmpfs needs root, and CI runs the suite as root: this row of the fault matrix must not go untested there")
		}
		t.Skip("mounting a tmpfs needs root (the test machine and CI run the suite as root)")
	}
	bin := joblibBinary(t)
	dir := t.TempDir()
	token := "jl_faults_" + uuid.NewString()
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mount -t tmpfs -o size=3m tmpfs "$1" && exec "$2" serve`, "sh", dir, bin)
	cmd.Env = append(hermeticEnv(), "JOBLIB_LISTEN_ADDR=127.0.0.1:0", "JOBLIB_DATABASE_URL="+filepath.Join(dir, "joblib.db"), "JOBLIB_ADMIN_TOKEN="+token)
	p := launchCmd(t, cmd)
	p.waitListening(t)
	base := p.base()
	if st, _, b := call(t, "PUT", base+"/rooms/r/jobs", token, map[string]any{"category": "modifiers", "name": "J", "schema": map[string]any{}}); st != 201 {
		t.Fatalf("register job: %d %v", st, b)
	}
	blob := strings.Repeat("x", 100_000)
	submitBig := func() (int, map[string]any, string) {
		st, h, b := call(t, "POST", base+"/rooms/r/tasks/r:modifiers:J", token, map[string]any{"payload": map[string]any{"blob": blob}})
		return st, b, h.Get("Retry-After")
	}
	var accepted []string
	full := false
	for range 100 {
		st, b, retry := submitBig()
		if st == 202 {
			accepted = append(accepted, b["id"].(string))
			continue
		}
		if st != 503 || b["type"] != "/v1/problems/storage-full" || retry == "" {
			t.Fatalf("a write on a full disk answered %d (Retry-After %q): %v\n%s", st, retry, b, p.stderr)
		}
		full = true
		break
	}
	if !full || len(accepted) == 0 {
		t.Fatalf("accepted %d submissions, disk full: %v", len(accepted), full)
	}
	// Reads go on; every accepted task is there.
	for _, id := range accepted {
		if st, _, tk := call(t, "GET", base+"/tasks/"+id, token, nil); st != 200 || tk["status"] != "pending" {
			t.Fatalf("accepted task %s on a full disk: %d %v", id, st, tk)
		}
	}
	// Space freed: the same process writes again.
	grow := exec.Command("nsenter", "--target", strconv.Itoa(cmd.Process.Pid), "--mount", "mount", "-o", "remount,size=64m", dir)
	if out, err := grow.CombinedOutput(); err != nil {
		t.Fatalf("grow the tmpfs: %v %s", err, out)
	}
	var st int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if st, _, _ = submitBig(); st == 202 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("writes still refused (%d) after space was freed\n%s", st, p.stderr)
		}
	}
	var page map[string]any
	if st, _, page = call(t, "GET", base+"/rooms/r/tasks?limit=0", token, nil); st != 200 {
		t.Fatalf("list: %d %v", st, page)
	}
	if n, _ := page["total"].(float64); int(n) < len(accepted)+1 {
		t.Fatalf("%v tasks after the disk was freed, want at least %d", page["total"], len(accepted)+1)
	}
	for _, id := range accepted {
		if st, _, _ := call(t, "GET", base+"/tasks/"+id, token, nil); st != 200 {
			t.Fatalf("task %s lost after the disk was full: %d", id, st)
		}
	}
	if p.cmd.ProcessState != nil {
		t.Fatal("the server exited")
	}
}

// TestFaultTasksTableLocked: another session holds an ACCESS EXCLUSIVE lock
// on the tasks table (a migration, a long maintenance statement) for longer
// than the worker timeout. Requests that need the table answer 503
// statement-timeout within their database budget, never hang and never 500;
// heartbeats go on, so nobody is judged stale; once the lock goes,
// everything works and no cleanup came of the stall. (The suite's short form
// of a 30 s lock: 6 s, against a 4 s worker timeout and 2 s budgets; with
// 1 s budgets a heartbeat on the loaded 2-core test machine, -race suites
// beside it, sometimes took longer than its budget before the lock.)
func TestFaultTasksTableLocked(t *testing.T) {
	t.Parallel()
	joblibBinary(t)
	dbURL := dbtest.URL(t, models.Postgres)
	token := "jl_faults_" + uuid.NewString()
	p := startServe(t, "JOBLIB_DATABASE_URL="+dbURL, "JOBLIB_ADMIN_TOKEN="+token, "JOBLIB_WORKER_TIMEOUT=4s", "JOBLIB_SWEEPER_INTERVAL=1s",
		"JOBLIB_READ_DB_TIMEOUT=2s", "JOBLIB_WRITE_DB_TIMEOUT=2s")
	base := p.base()
	id, heartbeat, strictHeartbeat := restWorkerWithRunningTask(t, p, token)
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(300 * time.Millisecond) {
		heartbeat() // the sweeper leads and its guard has passed
	}

	ctx := t.Context()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE tasks IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	locked := time.Now()
	var mu sync.Mutex
	var worst time.Duration
	var wg sync.WaitGroup
	wg.Go(func() {
		for time.Since(locked) < 6*time.Second {
			start := time.Now()
			st, h, b := call(t, "POST", base+"/rooms/r/tasks/r:modifiers:J", token, map[string]any{"payload": map[string]any{}})
			took := time.Since(start)
			if st != 503 || b["type"] != "/v1/problems/statement-timeout" || h.Get("Retry-After") == "" {
				t.Errorf("submission during the lock: %d %v", st, b)
				return
			}
			mu.Lock()
			worst = max(worst, took)
			mu.Unlock()
		}
	})
	for time.Since(locked) < 6*time.Second {
		strictHeartbeat() // the lock on tasks does not reach heartbeats
		time.Sleep(300 * time.Millisecond)
	}
	wg.Wait()
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(300 * time.Millisecond) {
		heartbeat()
	}
	if st, _, tk := call(t, "GET", base+"/tasks/"+id, token, nil); st != 200 || tk["status"] != "running" {
		t.Fatalf("the running task after the lock: %d %v", st, tk)
	}
	submit(t, base, token, "r", "r:modifiers:J")
	var cleanups int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM cleanup_events").Scan(&cleanups); err != nil {
		t.Fatal(err)
	}
	if cleanups != 0 {
		t.Fatalf("%d cleanups came of the lock", cleanups)
	}
	if worst > 5*time.Second {
		t.Fatalf("a submission during the lock took %s with a 2 s budget", worst)
	}
	t.Logf("tasks table locked 6 s: submissions answered 503 statement-timeout within %s (budget 2 s); no cleanup", worst.Round(time.Millisecond))
}

// latencyProxy forwards TCP connections to target, delaying every chunk by
// the current one-way delay (both directions: a round trip costs twice it).
// Chunks keep their order; the delay is not serialised across chunks.
type latencyProxy struct {
	ln    net.Listener
	delay atomic.Int64 // one way, nanoseconds
}

func startLatencyProxy(t *testing.T, target string) *latencyProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &latencyProxy{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go p.pipe(c, u)
			go p.pipe(u, c)
		}
	}()
	return p
}

func (p *latencyProxy) pipe(from, to net.Conn) {
	type chunk struct {
		at   time.Time
		data []byte
	}
	q := make(chan chunk, 1024)
	go func() {
		defer to.Close()
		for c := range q {
			time.Sleep(time.Until(c.at))
			if _, err := to.Write(c.data); err != nil {
				return
			}
		}
	}()
	defer close(q)
	defer from.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			q <- chunk{time.Now().Add(time.Duration(p.delay.Load())), append([]byte(nil), buf[:n]...)}
		}
		if err != nil {
			return
		}
	}
}

// TestFaultSlowDatabase: 200 ms added to every database round trip (a TCP
// proxy between `joblib serve` and PostgreSQL) with a 3 s worker timeout. A
// socket-bound worker (kept alive by its node) and a REST worker
// (heartbeating every second) live through more than two worker timeouts:
// nobody is reaped. Tasks claimed by both at once are each claimed once. The
// sweep duration metric shows the latency.
func TestFaultSlowDatabase(t *testing.T) {
	t.Parallel()
	joblibBinary(t)
	dbURL := dbtest.URL(t, models.Postgres)
	u, err := neturl.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startLatencyProxy(t, u.Host)
	u.Host = proxy.ln.Addr().String()
	token := "jl_faults_" + uuid.NewString()
	p := startServe(t, "JOBLIB_DATABASE_URL="+u.String(), "JOBLIB_ADMIN_TOKEN="+token, "JOBLIB_WORKER_TIMEOUT=3s", "JOBLIB_SWEEPER_INTERVAL=1s")
	base := p.base()
	newWorker := func() string {
		t.Helper()
		st, _, w := call(t, "POST", base+"/workers", token, map[string]any{})
		if st != 201 {
			t.Fatalf("create worker: %d %v", st, w)
		}
		wid := w["id"].(string)
		if st, _, b := call(t, "PUT", base+"/rooms/r/jobs", token, map[string]any{"category": "modifiers", "name": "J", "schema": map[string]any{}, "worker_id": wid}); st != 200 && st != 201 {
			t.Fatalf("register job: %d %v", st, b)
		}
		return wid
	}
	// The socket client starts first: starting node can take seconds on a
	// loaded machine, and a worker created before it would be reaped (no
	// heartbeat for a worker timeout) before its socket joined.
	ag := startAgent(t)
	ag.connect("w", "http://"+p.addr, token)
	rest, sock := newWorker(), newWorker()
	ag.emit("w", "join_job_room", map[string]any{"job_name": "r:modifiers:J", "worker_id": sock})
	// The REST worker heartbeats every second, as a client's background
	// thread does, from now to the end. The heartbeats never fail the test
	// from their goroutine: they report to endBeats, which the test (or its
	// cleanup, when it fails early) calls before the server stops.
	beatCtx, stopBeats := context.WithCancel(context.Background())
	beats := make(chan error, 1)
	go func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-beatCtx.Done():
				beats <- nil
				return
			case <-tick.C:
			}
			if err := heartbeatOnce(beatCtx, base+"/workers/"+rest, token); err != nil {
				beats <- fmt.Errorf("heartbeat of the REST worker: %w", err)
				return
			}
		}
	}()
	var endOnce sync.Once
	var beatErr error
	endBeats := func() error {
		endOnce.Do(func() { stopBeats(); beatErr = <-beats })
		return beatErr
	}
	t.Cleanup(func() { endBeats() })

	proxy.delay.Store(int64(100 * time.Millisecond)) // 200 ms per round trip from here on
	const tasks = 6
	for range tasks {
		submit(t, base, token, "r", "r:modifiers:J")
	}
	var mu sync.Mutex
	claimed := map[string]int{}
	var wg sync.WaitGroup
	for _, wid := range []string{rest, sock} {
		wg.Go(func() {
			for {
				st, _, c := call(t, "POST", base+"/tasks/claim", token, map[string]any{"worker_id": wid})
				if st != 200 {
					t.Errorf("claim: %d %v", st, c)
					return
				}
				tk, _ := c["task"].(map[string]any)
				if tk == nil {
					return
				}
				mu.Lock()
				claimed[tk["id"].(string)]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(claimed) != tasks {
		t.Fatalf("%d distinct tasks claimed, want %d", len(claimed), tasks)
	}
	for id, n := range claimed {
		if n != 1 {
			t.Fatalf("task %s claimed %d times", id, n)
		}
	}
	// Two worker timeouts and more under the latency.
	time.Sleep(7 * time.Second)
	if err := endBeats(); err != nil {
		t.Fatalf("%v\n%s", err, p.stderr)
	}
	proxy.delay.Store(0)
	st, _, list := call(t, "GET", base+"/workers?limit=500", token, nil)
	if st != 200 {
		t.Fatalf("list workers: %d %v", st, list)
	}
	alive := map[string]bool{}
	for _, it := range list["items"].([]any) {
		alive[it.(map[string]any)["id"].(string)] = true
	}
	if !alive[rest] || !alive[sock] {
		t.Fatalf("workers reaped under the latency: REST alive %v, socket alive %v\n%s", alive[rest], alive[sock], p.stderr)
	}
	for _, e := range ag.received("w") {
		if e.Event == "$disconnect" {
			t.Fatalf("the socket worker was disconnected: %s", e.Reason)
		}
	}
	sum := metricLines(t, p, "joblib_sweep_duration_seconds_sum")
	count := metricLines(t, p, "joblib_sweep_duration_seconds_count")
	var s, n float64
	fmt.Sscanf(sum, "joblib_sweep_duration_seconds_sum %g", &s)
	fmt.Sscanf(count, "joblib_sweep_duration_seconds_count %g", &n)
	if n == 0 || s/n < 0.1 {
		t.Fatalf("sweep durations do not show the latency: %s; %s", sum, count)
	}
	t.Logf("200 ms per database round trip for 7 s, worker timeout 3 s: no worker reaped, %d tasks claimed once each by two workers at once; mean sweep %.0f ms", tasks, 1000*s/n)
}

// TestFaultNATSOutage: two nodes on one PostgreSQL with the NATS bus (a
// nats-server of the test's own), which is killed for 3 s (the suite's form
// of a 20 s outage) while tasks change on the other node. Nothing is lost
// from the database and no request fails; when NATS is back each node
// reconnects by itself and reports the gap, so the UI on the other node is
// told to refetch; later events flow again.
func TestFaultNATSOutage(t *testing.T) {
	t.Parallel()
	joblibBinary(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	startNATS := func() *exec.Cmd {
		t.Helper()
		c := exec.Command("/usr/sbin/nats-server", "-a", "127.0.0.1", "-p", port)
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if conn, err := net.Dial("tcp", "127.0.0.1:"+port); err == nil {
				conn.Close()
				return c
			}
			if time.Now().After(deadline) {
				t.Fatal("nats-server did not listen")
			}
		}
	}
	nats := startNATS()
	dbURL := dbtest.URL(t, models.Postgres)
	token := "jl_faults_" + uuid.NewString()
	subject := "joblib.faults." + uuid.NewString()
	env := func(name string) []string {
		return []string{"JOBLIB_DATABASE_URL=" + dbURL, "JOBLIB_ADMIN_TOKEN=" + token, "JOBLIB_NODE_ID=" + name,
			"JOBLIB_BUS_URL=nats://127.0.0.1:" + port, "JOBLIB_BUS_SUBJECT=" + subject}
	}
	a, b := launchServe(t, env("a")...), launchServe(t, env("b")...)
	a.waitListening(t)
	b.waitListening(t)
	st, _, w := call(t, "POST", a.base()+"/workers", token, map[string]any{})
	if st != 201 {
		t.Fatalf("create worker: %d %v", st, w)
	}
	wid := w["id"].(string)
	if st, _, body := call(t, "PUT", a.base()+"/rooms/n/jobs", token, map[string]any{"category": "modifiers", "name": "J", "schema": map[string]any{}, "worker_id": wid}); st != 201 {
		t.Fatalf("register job: %d %v", st, body)
	}
	ag := startAgent(t)
	ag.connect("ui", "http://"+b.addr, token)
	ag.emit("ui", "join_room", map[string]any{"room_id": "n"})
	before := submit(t, a.base(), token, "n", "n:modifiers:J")
	ag.waitFor("an event through NATS", 5*time.Second, statusIs("ui", before, "pending"))

	if err := nats.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = nats.Wait()
	down := time.Now()
	during := submit(t, a.base(), token, "n", "n:modifiers:J")
	if st, _, c := call(t, "POST", a.base()+"/tasks/claim", token, map[string]any{"worker_id": wid}); st != 200 || c["task"] == nil {
		t.Fatalf("claim during the outage: %d %v", st, c)
	}
	time.Sleep(3*time.Second - time.Since(down))
	startNATS()
	up := time.Now()
	inv := ag.waitFor("the UI told to refetch after the outage", 15*time.Second, func(e agentEvent) bool {
		return e.Sock == "ui" && e.Event == "tasks_invalidate" && e.At.After(down)
	})
	// Nothing was lost from the database: node b reads what node a did.
	if st, _, tk := call(t, "GET", b.base()+"/tasks/"+before, token, nil); st != 200 || tk["status"] != "claimed" {
		t.Fatalf("the task claimed during the outage, read on the other node: %d %v", st, tk)
	}
	if st, _, tk := call(t, "GET", b.base()+"/tasks/"+during, token, nil); st != 200 || tk["status"] != "pending" {
		t.Fatalf("the task submitted during the outage, read on the other node: %d %v", st, tk)
	}
	after := submit(t, a.base(), token, "n", "n:modifiers:J")
	resumed := ag.waitFor("events flow again", 15*time.Second, statusIs("ui", after, "pending"))
	t.Logf("NATS down 3 s: UI invalidated %s after NATS was back, events flowing %s after", inv.At.Sub(up).Round(time.Millisecond), resumed.At.Sub(up).Round(time.Millisecond))
}

// heartbeatOnce sends one REST heartbeat (PATCH) for the worker at url,
// without a testing.T: it runs on a goroutine of its own. A request cut
// short by ctx is not an error.
func heartbeatOnce(ctx context.Context, url, token string) error {
	req, err := http.NewRequestWithContext(ctx, "PATCH", url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("%d %s", res.StatusCode, body)
	}
	return nil
}
