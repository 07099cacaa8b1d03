package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// runBin runs the built binary in dir as a user would, with only the given
// JOBLIB_ variables set, and returns its exit status and output.
func runBin(t *testing.T, dir string, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(joblibBinary(t), args...)
	cmd.Dir = dir
	cmd.Env = append(hermeticEnv(), env...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			code = ee.ExitCode()
		default:
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("joblib %s did not exit within 30s\n%s", strings.Join(args, " "), errb.String())
	}
	return code, out.String(), errb.String()
}

// hermeticEnv is the test process's environment without JOBLIB_ variables.
func hermeticEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "JOBLIB_") {
			env = append(env, kv)
		}
	}
	return env
}

// emptyDir fails the test if dir holds anything.
func emptyDir(t *testing.T, dir, after string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) > 0 {
		t.Fatalf("%s left %s in its working directory", after, ents[0].Name())
	}
}

// commandPaths lists every command line of the tree ("tasks retry", ...).
func commandPaths(c *command, prefix []string) [][]string {
	var out [][]string
	out = append(out, prefix)
	for _, s := range c.subs {
		out = append(out, commandPaths(s, append(append([]string(nil), prefix...), s.name))...)
	}
	return out
}

// --help and -h on every level print the usage on stdout, exit 0 and do
// nothing else: no database, even with a configuration that is broken.
func TestCLIHelpEverywhere(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	broken := []string{"JOBLIB_WORKER_TIMEOUT=soon"}
	paths := commandPaths(root(), nil)
	if len(paths) < 10 {
		t.Fatalf("only %d command paths", len(paths))
	}
	for _, p := range paths {
		for _, h := range []string{"--help", "-h"} {
			args := append(append([]string(nil), p...), h)
			code, out, errOut := runBin(t, dir, broken, args...)
			line := "joblib " + strings.Join(args, " ")
			if code != 0 || !strings.HasPrefix(out, "Usage: joblib") || errOut != "" {
				t.Fatalf("%s: exit %d\nstdout: %s\nstderr: %s", line, code, out, errOut)
			}
			emptyDir(t, dir, line)
		}
	}
	// The serve usage names the flag and the variable beside it.
	_, out, _ := runBin(t, dir, nil, "serve", "--help")
	if !strings.Contains(out, "-listen") || !strings.Contains(out, "JOBLIB_LISTEN_ADDR") {
		t.Fatalf("serve --help:\n%s", out)
	}
}

// A command line joblib does not understand exits 2 naming what it did not
// understand, and does nothing.
func TestCLIUsageErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--port", "9000"}, "unknown flag --port"},
		{[]string{"migrate", "--force"}, "unknown flag --force"},
		{[]string{"workers", "list", "-bogus=1"}, "unknown flag -bogus"},
		{[]string{"--port=1"}, "unknown flag --port"},
		{[]string{"frob"}, `unknown command "frob"`},
		{[]string{"tasks"}, "missing command"},
		{[]string{"tasks", "retry"}, "want 1 argument(s) (ID), got 0"},
		{[]string{"tasks", "retry", "not-a-uuid"}, `"not-a-uuid" is not a task id`},
		{[]string{"token", "create"}, "--user is required"},
		{[]string{"workers", "list", "extra"}, `unexpected argument "extra"`},
		{[]string{"sweep", "--threshold", "soon"}, `--threshold must be a positive duration, e.g. 90s or 90 (seconds), got "soon"`},
		// Below twice the socket keep-alive (10 s by default) a sweep would
		// reap live socket workers.
		{[]string{"sweep", "--fix", "--threshold", "5s"}, "below twice the socket keep-alive interval (10s)"},
		{[]string{"sweep", "--threshold", "19"}, "use at least 20s"},
		{[]string{"audit", "list", "--action", "bogus"}, `--action "bogus" is not an audited action; one of task_retry, task_cancel, worker_delete,`},
		{[]string{"tasks", "cancel", "nope"}, `"nope" is not a task id`},
		{[]string{"workers", "delete"}, "want 1 argument(s) (ID), got 0"},
		{[]string{"health", "--url", "localhost:8080"}, `"localhost:8080" is not a server URL such as http://host:8080`},
	} {
		line := "joblib " + strings.Join(c.args, " ")
		code, out, errOut := runBin(t, dir, nil, c.args...)
		if code != 2 || !strings.Contains(errOut, c.want) || out != "" {
			t.Fatalf("%s: exit %d, want 2 with %q\nstdout: %s\nstderr: %s", line, code, c.want, out, errOut)
		}
		if !strings.Contains(errOut, "--help' for usage") {
			t.Fatalf("%s: no pointer to the usage:\n%s", line, errOut)
		}
		emptyDir(t, dir, line)
	}
}

func TestCLIVersion(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, args := range [][]string{{"--version"}, {"version"}} {
		code, out, _ := runBin(t, dir, nil, args...)
		if code != 0 || !strings.HasPrefix(out, "joblib ") || !strings.Contains(out, "commit ") || !strings.Contains(out, "go1.") {
			t.Fatalf("joblib %s: exit %d: %q", args[0], code, out)
		}
	}
	emptyDir(t, dir, "joblib --version")
}

// Operator commands never create a database: run where there is none,
// they name the file they looked for and how to make one, and leave the
// directory empty. On PostgreSQL, a schema joblib never migrated is refused
// and left empty.
func TestOperatorCommandsNeverCreateADatabase(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cmds := [][]string{{"workers", "list"}, {"tasks", "list"}, {"sweep"}, {"sweep", "--fix"},
		{"token", "create", "--user", "ops"}, {"tasks", "retry", "0b0f6a4e-2f59-4c43-9a53-1f0a3b0e3c11"},
		{"tasks", "cancel", "0b0f6a4e-2f59-4c43-9a53-1f0a3b0e3c11"}, {"workers", "delete", "0b0f6a4e-2f59-4c43-9a53-1f0a3b0e3c11"},
		{"jobs", "list"}, {"rooms", "list"}}
	for _, args := range cmds {
		line := "joblib " + strings.Join(args, " ")
		code, _, errOut := runBin(t, dir, nil, args...)
		if code != 1 || !strings.Contains(errOut, filepath.Join(dir, "joblib.db")) || !strings.Contains(errOut, "joblib migrate") {
			t.Fatalf("%s: exit %d\n%s", line, code, errOut)
		}
		emptyDir(t, dir, line)
	}
	pg := dbtest.URL(t, models.Postgres)
	code, _, errOut := runBin(t, dir, []string{"JOBLIB_DATABASE_URL=" + pg}, "workers", "list")
	if code != 1 || !strings.Contains(errOut, "no joblib tables") {
		t.Fatalf("workers list on an empty PostgreSQL schema: exit %d\n%s", code, errOut)
	}
	db, err := models.Open(context.Background(), pg, models.OpenOptions{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if ok, err := db.HasSchema(context.Background()); err != nil || ok {
		t.Fatalf("the operator command migrated an empty schema: %v %v", ok, err)
	}
	// migrate creates it and names it; then the operator commands work on it.
	code, out, errOut := runBin(t, dir, nil, "migrate")
	if code != 0 || !strings.Contains(out, filepath.Join(dir, "joblib.db")+": schema at version") {
		t.Fatalf("migrate: exit %d\n%s\n%s", code, out, errOut)
	}
	code, out, errOut = runBin(t, dir, nil, "workers", "list")
	if code != 0 || !strings.Contains(out, "0 worker(s)") || !strings.Contains(errOut, "opened database") || !strings.Contains(errOut, filepath.Join(dir, "joblib.db")) {
		t.Fatalf("workers list after migrate: exit %d\n%s\n%s", code, out, errOut)
	}
}

// Database URLs joblib cannot use are refused with what to fix, before any
// file is created.
func TestDatabaseURLErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	code, _, errOut := runBin(t, dir, []string{"JOBLIB_DATABASE_URL=mysql://user@db/joblib"}, "migrate")
	if code != 1 || !strings.Contains(errOut, "JOBLIB_DATABASE_URL") || !strings.Contains(errOut, `"mysql://"`) || !strings.Contains(errOut, "postgres://") {
		t.Fatalf("mysql URL: exit %d\n%s", code, errOut)
	}
	emptyDir(t, dir, "migrate with a mysql URL")

	missing := filepath.Join(dir, "no", "such", "dir", "j.db")
	code, _, errOut = runBin(t, dir, []string{"JOBLIB_DATABASE_URL=" + missing}, "migrate")
	if code != 1 || !strings.Contains(errOut, "directory "+filepath.Dir(missing)+" does not exist") {
		t.Fatalf("missing directory: exit %d\n%s", code, errOut)
	}

	// A file that is not a SQLite database, and a directory in its place.
	notDB := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(notDB, []byte(strings.Repeat("not a database\n", 100)), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = runBin(t, dir, []string{"JOBLIB_DATABASE_URL=" + notDB}, "migrate")
	if code != 1 || !strings.Contains(errOut, notDB+" is not a usable SQLite database") {
		t.Fatalf("not a database: exit %d\n%s", code, errOut)
	}
	code, _, errOut = runBin(t, dir, []string{"JOBLIB_DATABASE_URL=" + dir}, "migrate")
	if code != 1 || !strings.Contains(errOut, "is a directory, not a file") {
		t.Fatalf("a directory: exit %d\n%s", code, errOut)
	}

	// A directory the user may not write to: as root, run as nobody.
	base, err := os.MkdirTemp("", "joblib-ro-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil { // nobody may enter it
		t.Fatal(err)
	}
	ro := filepath.Join(base, "ro")
	if err := os.Mkdir(ro, 0o555); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(joblibBinary(t), "migrate")
	cmd.Dir = base
	cmd.Env = append(hermeticEnv(), "JOBLIB_DATABASE_URL="+filepath.Join(ro, "j.db"))
	if os.Getuid() == 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "directory "+ro+" is not writable by this user") ||
		strings.Contains(string(out), "out of memory") {
		t.Fatalf("unwritable directory: %v\n%s", err, out)
	}
}

// Every configuration error names its variable and happens before any
// database is created; unknown JOBLIB_ variables are warned about with the
// closest known name.
func TestConfigurationCheckedFirst(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, c := range []struct {
		env        string
		want, dont string
	}{
		{"JOBLIB_LISTEN_ADDR=8080", "JOBLIB_LISTEN_ADDR", ""},
		{"JOBLIB_WORKER_TIMEOUT=0s", "JOBLIB_WORKER_TIMEOUT must be positive", "KEEPALIVE"},
		{"JOBLIB_WORKER_TIMEOUT=soon", "JOBLIB_WORKER_TIMEOUT", ""},
		{"JOBLIB_TASK_MAX_RESULT_BYTES=0", "JOBLIB_TASK_MAX_RESULT_BYTES", ""},
		{"JOBLIB_GROUP_COMMIT_DELAY=1s", "JOBLIB_GROUP_COMMIT_DELAY must be at least 0 and below 10ms", ""},
		{"JOBLIB_BUILTIN_JOBS=maybe", "JOBLIB_BUILTIN_JOBS", ""},
	} {
		code, _, errOut := runBin(t, dir, []string{c.env}, "serve")
		if code != 1 || !strings.Contains(errOut, c.want) || (c.dont != "" && strings.Contains(errOut, c.dont)) {
			t.Fatalf("serve with %s: exit %d\n%s", c.env, code, errOut)
		}
		emptyDir(t, dir, "serve with "+c.env)
	}
	code, _, errOut := runBin(t, dir, []string{"JOBLIB_WORKR_TIMEOUT=5s", "JOBLIB_DATABASE_URL=" + filepath.Join(dir, "j.db")}, "migrate")
	if code != 0 || !strings.Contains(errOut, "unknown variable JOBLIB_WORKR_TIMEOUT is ignored; did you mean JOBLIB_WORKER_TIMEOUT?") {
		t.Fatalf("misspelled variable: exit %d\n%s", code, errOut)
	}
}

// startServeOut is startServe that also returns the process's stdout, line
// by line.
func startServeOut(t *testing.T, dir string, args []string, env ...string) (*proc, <-chan string) {
	t.Helper()
	cmd := exec.Command(joblibBinary(t), append([]string{"serve"}, args...)...)
	cmd.Env = append(hermeticEnv(), env...)
	cmd.Dir = dir
	pr, pw := io.Pipe()
	p := &proc{cmd: cmd, stderr: &syncBuffer{}, done: make(chan error, 1)}
	cmd.Stderr = io.MultiWriter(pw, p.stderr)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	go func() { p.done <- cmd.Wait(); pw.Close() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if m := listenLine.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
				break
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	select {
	case p.addr = <-addr:
	case err := <-p.done:
		t.Fatalf("joblib serve exited before listening: %v\n%s", err, p.stderr)
	case <-time.After(30 * time.Second):
		t.Fatalf("joblib serve did not listen within 30s\n%s", p.stderr)
	}
	return p, lines
}

func (p *proc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("serve exited with %v\n%s", err, p.stderr)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("serve did not stop\n%s", p.stderr)
	}
}

// A busy port stops serve before it touches the database, so the one-time
// admin token of a fresh database is not consumed; the next start prints
// it once it serves, and the token works at once.
func TestServeBusyPortKeepsTheAdminToken(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	code, out, errOut := runBin(t, dir, nil, "serve", "--listen", busy.Addr().String())
	if code != 1 || out != "" || !strings.Contains(errOut, "listen on "+busy.Addr().String()) || !strings.Contains(errOut, "JOBLIB_LISTEN_ADDR") {
		t.Fatalf("busy port: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	emptyDir(t, dir, "serve on a busy port")

	p, lines := startServeOut(t, dir, []string{"--listen", "127.0.0.1:0"})
	var token string
	deadline := time.After(10 * time.Second)
	for token == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("stdout closed without a token\n%s", p.stderr)
			}
			if strings.HasPrefix(l, "jl_") {
				token = l
			} else if !strings.Contains(l, "admin") && !strings.Contains(l, "token create") {
				t.Fatalf("unexpected stdout line %q", l)
			}
		case <-deadline:
			t.Fatalf("no admin token printed\n%s", p.stderr)
		}
	}
	st, body, _ := callRaw(t, "GET", p.base()+"/workers", token, nil)
	if st != 200 {
		t.Fatalf("the printed token: %d %s", st, body)
	}
	// The container health check: ready while serving, failing once stopped.
	if code, out, errOut := runBin(t, dir, []string{"JOBLIB_LISTEN_ADDR=" + p.addr}, "health"); code != 0 || !strings.HasPrefix(out, "ready:") {
		t.Fatalf("health while serving: exit %d %s %s", code, out, errOut)
	}
	p.stop(t)
	if code, _, errOut := runBin(t, dir, []string{"JOBLIB_LISTEN_ADDR=" + p.addr}, "health"); code != 1 || !strings.Contains(errOut, "no server listens at http://127.0.0.1:") {
		t.Fatalf("health after stop: exit %d %s", code, errOut)
	}
	// A restart on the same database prints no token.
	p, lines = startServeOut(t, dir, []string{"--listen", "127.0.0.1:0"})
	p.stop(t)
	for l := range lines {
		t.Fatalf("second start printed %q", l)
	}
}

// The built-in RoomSummary job is opt-in: by default a room lists exactly
// the three jobs registered in it; with JOBLIB_BUILTIN_JOBS=true it lists
// four and runs; switched off again, the job row is retired.
func TestBuiltinJobsOptIn(t *testing.T) {
	t.Parallel()
	const token = testAdminToken
	dir := t.TempDir()
	env := []string{"JOBLIB_DATABASE_URL=" + filepath.Join(dir, "j.db"), "JOBLIB_ADMIN_TOKEN=" + token}
	count := func(p *proc) int {
		t.Helper()
		st, _, m := call(t, "GET", p.base()+"/rooms/room1/jobs", token, nil)
		if st != 200 {
			t.Fatalf("list jobs: %d %v", st, m)
		}
		return int(m["total"].(float64))
	}
	p, _ := startServeOut(t, dir, []string{"--listen", "127.0.0.1:0"}, env...)
	for _, n := range []string{"A", "B", "C"} {
		if st, _, m := call(t, "PUT", p.base()+"/rooms/room1/jobs", token, map[string]any{"category": "modifiers", "name": n, "schema": map[string]any{}}); st != 201 {
			t.Fatalf("register %s: %d %v", n, st, m)
		}
	}
	if n := count(p); n != 3 {
		t.Fatalf("default: room lists %d jobs, want 3", n)
	}
	st, _, m := call(t, "POST", p.base()+"/rooms/room1/tasks/@internal:analysis:RoomSummary", token, map[string]any{"payload": map[string]any{}})
	if st != 404 {
		t.Fatalf("RoomSummary without JOBLIB_BUILTIN_JOBS: %d %v", st, m)
	}
	p.stop(t)

	p, _ = startServeOut(t, dir, []string{"--listen", "127.0.0.1:0"}, append(env, "JOBLIB_BUILTIN_JOBS=true")...)
	if n := count(p); n != 4 {
		t.Fatalf("JOBLIB_BUILTIN_JOBS=true: room lists %d jobs, want 4", n)
	}
	st, _, m = call(t, "POST", p.base()+"/rooms/room1/tasks/@internal:analysis:RoomSummary", token, map[string]any{"payload": map[string]any{}})
	if st != 202 {
		t.Fatalf("submit RoomSummary: %d %v", st, m)
	}
	st, _, m = call(t, "GET", p.base()+"/tasks/"+m["id"].(string), token, nil, "Prefer: wait=10")
	if st != 200 || m["status"] != "completed" || m["result"].(map[string]any)["jobs"] != float64(4) {
		t.Fatalf("RoomSummary task: %d %v", st, m)
	}
	p.stop(t)

	p, _ = startServeOut(t, dir, []string{"--listen", "127.0.0.1:0"}, env...)
	if n := count(p); n != 3 {
		t.Fatalf("switched off again: room lists %d jobs, want 3", n)
	}
	p.stop(t)
}
