package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// TestProxyBesideHostApp runs the deployment joblib's users run: Debian's
// nginx, configured with deploy/nginx's files word for word (only listen
// addresses and upstream servers replaced), in front of two `joblib serve`
// nodes on one PostgreSQL and of the example host app (examples/host), which
// issues the JWTs and answers the room-auth callback; and Debian's Caddy
// with deploy/caddy's two files beside it. Through the proxies:
//
//   - logins at the host give JWTs joblib accepts (shared secret, audience);
//   - socket.io-client UIs (polling then websocket upgrade, on the host's
//     origin; polling only on joblib's own origin with the host's Origin)
//     and python-socketio clients join rooms under room delegation: the
//     host's answer admits alice to room alice and refuses bob;
//   - a Python worker (examples/python/worker.py) registers, claims and
//     completes; the UIs receive every status event exactly once;
//   - the node holding a UI's session is SIGKILLed: the UIs and the worker
//     carry on through the other node (reconnect, rejoin, next task); a UI
//     whose session survived but whose websocket the balancer had routed
//     through the killed node (joblib forwarded it) recovers its session;
//   - a `Prefer: wait=30` long-poll is held for its 30 s and answered
//     (nginx and Caddy), while the same nginx file with its
//     proxy_read_timeout lowered to 2 s cuts the same long-poll with a 504:
//     the timeouts in the files are the ones nginx applies to joblib's paths;
//   - the per-address session budget counts the clients' addresses, which
//     nginx passes in X-Forwarded-For (JOBLIB_TRUSTED_PROXIES), and layout
//     1 answers the host origin's CORS preflights;
//   - the host goes down: joins and room calls joblib has no answer for
//     fail closed (503), while rooms already joined keep receiving.
//
// The long-poll makes it last a little over 30 s.
func TestProxyBesideHostApp(t *testing.T) {
	t.Parallel()
	began := time.Now()
	joblibBinary(t)
	for _, need := range []string{nginxPath, "/usr/bin/python3"} {
		if _, err := os.Stat(need); err != nil {
			t.Fatalf("%s: %v (scripts/test.sh installs Debian's nginx, python3-fastapi, python3-uvicorn, python3-jwt)", need, err)
		}
	}
	dbURL := dbtest.URL(t, models.Postgres)

	// The host app: logins and rooms.
	secret := "host-secret-" + uuid.NewString()
	host, hostAddr := startHost(t, secret)

	// Two joblib nodes sharing the host's JWT secret and asking it about rooms.
	token := "jl_proxy_" + uuid.NewString()
	const perAddr = 20 // Engine.IO sessions per client address
	env := func(name string) []string {
		return []string{"JOBLIB_DATABASE_URL=" + dbURL, "JOBLIB_ADMIN_TOKEN=" + token, "JOBLIB_NODE_ID=" + name,
			"JOBLIB_JWT_SECRET=" + secret, "JOBLIB_ROOM_AUTH_URL=http://" + hostAddr + "/joblib/room-auth",
			"JOBLIB_ALLOWED_ORIGINS=app.example.com", "JOBLIB_TRUSTED_PROXIES=127.0.0.1",
			"JOBLIB_SOCKET_MAX_SESSIONS_PER_ADDR=" + strconv.Itoa(perAddr),
			"JOBLIB_NODE_LEASE_TIMEOUT=2s", "JOBLIB_SWEEPER_INTERVAL=1s"}
	}
	nodes := map[string]*proc{"a": launchServe(t, env("a")...), "b": launchServe(t, env("b")...)}
	for _, p := range nodes {
		p.waitListening(t)
	}

	// nginx, from deploy/nginx: layout 2 (the host's origin carries joblib's
	// paths), layout 1 (joblib's own origin), and layout 2 with its read
	// timeouts lowered (the control of the long-poll).
	upstreams := map[string]string{"127.0.0.1:8081": nodes["a"].addr, "127.0.0.1:8082": nodes["b"].addr, "127.0.0.1:8000": hostAddr}
	one := startNginx(t, "joblib-one-origin.conf", upstreams, nil)
	own := startNginx(t, "joblib-own-origin.conf", upstreams, nil)
	short := startNginx(t, "joblib-one-origin.conf", upstreams, map[string]string{"proxy_read_timeout 90s;": "proxy_read_timeout 2s;"})
	// Caddy with both files: more UIs, and the long-poll.
	cad := startCaddy(t, "joblib-one-origin.Caddyfile", "app.example.com", upstreams)
	cadOwn := startCaddy(t, "joblib-own-origin.Caddyfile", "joblib.example.com", upstreams)

	// Logins at the host, through the proxy, as fastapi-users' form.
	login := func(user string) string {
		t.Helper()
		res, err := http.PostForm(one+"/auth/jwt/login", url.Values{"username": {user}, "password": {user}})
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var tok struct {
			AccessToken string `json:"access_token"`
		}
		if err := json.NewDecoder(res.Body).Decode(&tok); err != nil || res.StatusCode != 200 || tok.AccessToken == "" {
			t.Fatalf("login %s: %d %v", user, res.StatusCode, err)
		}
		return tok.AccessToken
	}
	alice, bob := login("alice"), login("bob")
	api := func(base string) string { return base + "/v1/joblib" }

	// The Python worker, on joblib's own origin (workers send no Origin).
	worker := startPython(t, "worker", []string{"JOBLIB_URL=" + own, "JOBLIB_TOKEN=" + alice, "ROOM=alice", "WORKER_TIMEOUT=60"},
		"../../examples/python/worker.py")
	worker.expect(t, "ready ")

	// socket.io-client UIs.
	ag := startAgent(t)
	connect := func(sock, base, tok string, extra map[string]any) {
		t.Helper()
		cmd := map[string]any{"op": "connect", "sock": sock, "url": base, "token": tok, "reconnection": true, "recover": true}
		for k, v := range extra {
			cmd[k] = v
		}
		if _, err := ag.do(cmd); err != nil {
			t.Fatalf("connect %s to %s: %v", sock, base, err)
		}
	}
	join := func(sock, room string) map[string]any {
		t.Helper()
		res, err := ag.do(map[string]any{"op": "emit", "sock": sock, "event": "join_room", "payload": map[string]any{"room_id": room}})
		if err != nil {
			t.Fatalf("%s join_room %s: %v", sock, room, err)
		}
		var ack map[string]any
		_ = json.Unmarshal(res, &ack)
		return ack
	}
	mustJoin := func(sock, room string) {
		t.Helper()
		if ack := join(sock, room); ack["ok"] != true {
			t.Fatalf("%s join_room %s: %v", sock, room, ack)
		}
	}
	connect("ui-alice", one, alice, nil)
	mustJoin("ui-alice", "alice")
	connect("ui-caddy", cad, alice, nil)
	mustJoin("ui-caddy", "alice")
	connect("ui-caddy-own", cadOwn, alice, map[string]any{"transports": []string{"polling"}, "headers": map[string]string{"Origin": "https://app.example.com"}})
	mustJoin("ui-caddy-own", "alice")
	connect("ui-alice-own", own, alice, map[string]any{"transports": []string{"polling"}, "headers": map[string]string{"Origin": "https://app.example.com"}})
	mustJoin("ui-alice-own", "alice")
	if _, err := ag.do(map[string]any{"op": "connect", "sock": "ui-evil", "url": own, "token": alice,
		"headers": map[string]string{"Origin": "https://evil.example"}}); err == nil {
		t.Fatal("a socket from an origin outside JOBLIB_ALLOWED_ORIGINS connected through layout 1")
	}
	connect("ui-bob", one, bob, nil)
	if ack := join("ui-bob", "alice"); ack["ok"] != false || ack["status"] != float64(403) {
		t.Fatalf("bob joined alice's room: %v", ack)
	}
	mustJoin("ui-bob", "bob")
	// python-socketio (polling, then upgrade) under the same delegation:
	// the example's watcher logs bob in at the host and joins both rooms.
	py := startPython(t, "watch", nil, "../../examples/host/watch.py", "--host", one, "--user", "bob", "alice", "bob")
	acks := map[string]map[string]any{}
	for range 2 {
		room, raw, _ := strings.Cut(py.expect(t, "joined "), " ")
		var ack map[string]any
		_ = json.Unmarshal([]byte(raw), &ack)
		acks[room] = ack
	}
	if acks["alice"]["ok"] != false || acks["alice"]["status"] != float64(403) || acks["bob"]["ok"] != true {
		t.Fatalf("python-socketio (bob) through the proxy: %v, want alice refused with 403, bob admitted", acks)
	}
	if tr := py.expect(t, "transport "); tr != "websocket" {
		t.Fatalf("python-socketio through the proxy: transport %s, want websocket", tr)
	}
	if st, _, _ := call(t, "POST", api(one)+"/rooms/alice/tasks/alice:modifiers:Scale", bob, map[string]any{"payload": map[string]any{}}); st != 403 {
		t.Fatalf("bob submitted to alice's room: %d", st)
	}
	for _, ui := range []string{"ui-alice", "ui-alice-own"} {
		if tr := ag.transport(ui); tr != map[string]string{"ui-alice": "websocket", "ui-alice-own": "polling"}[ui] {
			t.Fatalf("%s transport %s", ui, tr)
		}
	}

	aliceUIs := []string{"ui-alice", "ui-alice-own", "ui-caddy", "ui-caddy-own"}

	// Layout 1's REST calls from the host's page: CORS through nginx.
	preflight := func(origin string) (int, http.Header) {
		t.Helper()
		req, _ := http.NewRequest("OPTIONS", api(own)+"/rooms/alice/jobs", nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", "GET")
		req.Header.Set("Access-Control-Request-Headers", "authorization")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode, res.Header
	}
	if st, h := preflight("https://app.example.com"); st != 204 || h.Get("Access-Control-Allow-Origin") != "https://app.example.com" ||
		!strings.Contains(strings.ToLower(h.Get("Access-Control-Allow-Headers")), "authorization") {
		t.Fatalf("preflight from the host's origin through layout 1: %d %v", st, h)
	}
	if st, h := preflight("https://evil.example"); st != 403 || h.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("preflight from another origin through layout 1: %d %v", st, h)
	}
	if st, h, _ := call(t, "GET", api(own)+"/rooms/alice/jobs", alice, nil, "Origin: https://app.example.com"); st != 200 ||
		h.Get("Access-Control-Allow-Origin") != "https://app.example.com" {
		t.Fatalf("cross-origin GET through layout 1: %d %v", st, h)
	}
	if tr := ag.transport("ui-caddy"); tr != "websocket" {
		t.Fatalf("ui-caddy transport %s", tr)
	}

	// A task through the whole chain.
	runTask := func() string {
		t.Helper()
		id := submit(t, api(one), alice, "alice", "alice:modifiers:Scale")
		worker.expect(t, "done "+id)
		for _, ui := range aliceUIs {
			ag.waitFor(ui+" completed "+id, 15*time.Second, statusIs(ui, id, "completed"))
		}
		return id
	}
	first := runTask()

	// Kill the node holding ui-alice's session.
	runs := nodeRuns(t, dbURL)
	roomOf := map[string]string{"ui-alice": "alice", "ui-alice-own": "alice", "ui-caddy": "alice", "ui-caddy-own": "alice", "ui-bob": "bob"}
	onNode := map[string]string{}
	for ui := range roomOf {
		onNode[ui] = runs[sessionRunOf(t, ag, ui)]
	}
	victim := onNode["ui-alice"]
	survivor := map[string]string{"a": "b", "b": "a"}[victim]
	if victim == "" {
		t.Fatalf("ui-alice's session names no known node: %v %v", runs, onNode)
	}
	killedAt := time.Now()
	kill(t, nodes[victim])
	// A UI whose session was on the killed node gets a fresh session on the
	// other one and joins again. Any UI may lose a request or a websocket
	// that round-robin had sent through the killed node (which forwarded it
	// to the session's node): it recovers its session on the survivor,
	// rooms and missed events included.
	for ui, node := range onNode {
		if node != victim {
			continue
		}
		c := ag.waitFor(ui+" reconnected", 15*time.Second, func(e agentEvent) bool {
			return e.Sock == ui && e.Event == "$connect" && e.At.After(killedAt)
		})
		if c.recovered() {
			t.Fatalf("%s recovered a session of the killed node", ui)
		}
		mustJoin(ui, roomOf[ui])
		if run := runs[sessionRunOf(t, ag, ui)]; run != survivor {
			t.Fatalf("%s reconnected to node %q, want %q", ui, run, survivor)
		}
	}

	// The per-address session budget counts the clients' own addresses
	// (X-Forwarded-For from nginx, believed from JOBLIB_TRUSTED_PROXIES), not
	// nginx's: with one node left, client 127.0.0.2 opens its budget of
	// sessions and is refused one more, while 127.0.0.3 and the test's other
	// clients (127.0.0.1, several sessions) still get in.
	handshake := func(from string) int {
		t.Helper()
		tr := &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}).DialContext}
		defer tr.CloseIdleConnections()
		res, err := (&http.Client{Transport: tr}).Get(one + "/socket.io/?EIO=4&transport=polling")
		if err != nil {
			t.Fatalf("handshake from %s: %v", from, err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	for i := range perAddr {
		if st := handshake("127.0.0.2"); st != 200 {
			t.Fatalf("handshake %d of %d from 127.0.0.2: %d (is every client counted as nginx's address?)", i+1, perAddr, st)
		}
	}
	if st := handshake("127.0.0.2"); st != 429 {
		t.Fatalf("handshake past the budget from 127.0.0.2: %d, want 429", st)
	}
	if st := handshake("127.0.0.3"); st != 200 {
		t.Fatalf("handshake from 127.0.0.3 after 127.0.0.2 spent its budget: %d", st)
	}

	// The long-poll, on a task nobody will take, through the configuration
	// and through its control with 2 s read timeouts.
	if st, _, b := call(t, "PUT", api(one)+"/rooms/alice/jobs", alice, map[string]any{"category": "analysis", "name": "Idle", "schema": map[string]any{}}); st != 201 {
		t.Fatalf("register alice:analysis:Idle: %d %v", st, b)
	}
	idle := submit(t, api(one), alice, "alice", "alice:analysis:Idle")
	type poll struct {
		status  int
		applied string
		task    map[string]any
		took    time.Duration
	}
	longPoll := func(base string) <-chan poll {
		out := make(chan poll, 1)
		go func() {
			start := time.Now()
			st, h, body := call(t, "GET", api(base)+"/tasks/"+idle, alice, nil, "Prefer: wait=30")
			out <- poll{st, h.Get("Preference-Applied"), body, time.Since(start)}
		}()
		return out
	}
	held, heldCaddy, cut := longPoll(one), longPoll(cad), longPoll(short)

	// Meanwhile the clients carry on through the surviving node.
	second := runTask()

	c := <-cut
	if c.status != 504 || c.took > 10*time.Second {
		t.Fatalf("through read timeouts of 2 s the long-poll answered %d after %s, want nginx's 504 after about 2 s", c.status, c.took)
	}
	for name, ch := range map[string]<-chan poll{"nginx": held, "caddy": heldCaddy} {
		h := <-ch
		if h.status != 200 || h.applied != "wait=30" || h.task["status"] != "pending" || h.took < 29*time.Second {
			t.Fatalf("long-poll through %s: %d %q %v after %s, want 200 wait=30 pending after 30 s", name, h.status, h.applied, h.task["status"], h.took)
		}
	}

	// The host goes down. joblib fails closed on what it has not asked
	// (503, never a guess); logins it already has go on working, rooms
	// already joined keep receiving.
	if err := host.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = host.cmd.Wait()
	if ack := join("ui-bob", "lobby"); ack["ok"] != false || ack["status"] != float64(503) {
		t.Fatalf("bob joined a room with the host down: %v", ack)
	}
	if st, _, b := call(t, "GET", api(one)+"/rooms/lobby/jobs", alice, nil); st != 503 || b["type"] != "/v1/problems/room-auth-unavailable" {
		t.Fatalf("a room read with the host down: %d %v", st, b)
	}
	if st, _, b := call(t, "PATCH", api(one)+"/tasks/"+idle, alice, map[string]any{"status": "cancelled"}); st != 200 {
		t.Fatalf("cancel with the host down: %d %v", st, b)
	}
	for _, ui := range aliceUIs {
		ag.waitFor(ui+" cancelled "+idle, 15*time.Second, statusIs(ui, idle, "cancelled"))
	}

	// Every status event exactly once on each UI of room alice, none of
	// them on bob's.
	want := map[string]int{idle + " cancelled": 1, first + " pending": 1, first + " claimed": 1, first + " running": 1, first + " completed": 1,
		second + " pending": 1, second + " claimed": 1, second + " running": 1, second + " completed": 1, idle + " pending": 1}
	for _, ui := range append(aliceUIs, "ui-bob") {
		got := map[string]int{}
		for _, e := range ag.received(ui) {
			if e.Event == "task_status_event" {
				got[e.field("id")+" "+e.field("status")]++
			}
		}
		if ui == "ui-bob" {
			if len(got) != 0 {
				t.Errorf("bob's UI received alice's room events: %v", got)
			}
			continue
		}
		for k, n := range got {
			if want[k] != n {
				t.Errorf("%s received %q %d times, want %d", ui, k, n, want[k])
			}
		}
		for k := range want {
			if got[k] == 0 {
				t.Errorf("%s never received %q", ui, k)
			}
		}
		for _, e := range ag.received(ui) {
			if e.Event == "$connect" && e.At.After(killedAt) && onNode[ui] != victim && !e.recovered() {
				t.Errorf("%s, on the surviving node, lost its session", ui)
			}
		}
	}
	reconnects := map[string]int{}
	for ui := range onNode {
		for _, e := range ag.received(ui) {
			if e.Event == "$connect" && e.At.After(killedAt) {
				reconnects[ui]++
			}
		}
	}
	t.Logf("sessions on nodes %v, killed %s, reconnections %v; whole test %s", onNode, victim, reconnects, time.Since(began).Round(time.Millisecond))
}

const nginxPath = "/usr/sbin/nginx"

// proxyFile reads a deploy file and makes each replacement of repl (keys
// are the file's own text: listen and upstream addresses, or a setting
// under test); every key must occur.
func proxyFile(t *testing.T, path string, repl map[string]string) string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	conf := string(raw)
	for k, v := range repl {
		if !strings.Contains(conf, k) {
			t.Fatalf("%s has no %q to replace", path, k)
		}
		conf = strings.ReplaceAll(conf, k, v)
	}
	return conf
}

// startNginx runs Debian's nginx in the foreground on a free loopback port
// with deploy/nginx/FILE, its placeholder addresses replaced by upstreams
// (those it has) and edits made. It returns the base URL.
func startNginx(t *testing.T, file string, upstreams, edits map[string]string) string {
	t.Helper()
	return onFreePort(t, func(addr string) (string, bool) { return runNginx(t, file, addr, upstreams, edits) })
}

func runNginx(t *testing.T, file, addr string, upstreams, edits map[string]string) (string, bool) {
	t.Helper()
	path := "../../deploy/nginx/" + file
	raw, _ := os.ReadFile(path)
	repl := map[string]string{"listen 80;": "listen " + addr + ";"}
	for k, v := range upstreams {
		if strings.Contains(string(raw), "server "+k) {
			repl["server "+k] = "server " + v
		}
	}
	maps.Copy(repl, edits)
	dir := t.TempDir()
	site := filepath.Join(dir, "site.conf")
	if err := os.WriteFile(site, []byte(proxyFile(t, path, repl)), 0o644); err != nil {
		t.Fatal(err)
	}
	// One process, no master (nothing to orphan, no user switch), every
	// path in dir.
	var main strings.Builder
	fmt.Fprintf(&main, "daemon off;\nmaster_process off;\npid %s/nginx.pid;\nerror_log stderr warn;\nevents {}\nhttp {\n", dir)
	for _, tmp := range []string{"client_body", "proxy", "fastcgi", "uwsgi", "scgi"} {
		fmt.Fprintf(&main, "    %s_temp_path %s/%s;\n", tmp, dir, tmp)
	}
	fmt.Fprintf(&main, "    log_format up '$remote_addr \"$request\" $status upstream=$upstream_addr $request_time';\n")
	fmt.Fprintf(&main, "    access_log %s/access.log up;\n    include %s;\n}\n", dir, site)
	if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(main.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(nginxPath, "-p", dir, "-c", filepath.Join(dir, "nginx.conf"), "-e", "stderr")
	return runProxy(t, "nginx "+file, cmd, addr, filepath.Join(dir, "access.log"))
}

// startCaddy runs Debian's caddy with deploy/caddy/FILE, its site served
// over plain HTTP on a free loopback port and its placeholder addresses
// replaced by upstreams. It returns the base URL.
func startCaddy(t *testing.T, file, site string, upstreams map[string]string) string {
	t.Helper()
	return onFreePort(t, func(addr string) (string, bool) { return runCaddy(t, file, site, addr, upstreams) })
}

func runCaddy(t *testing.T, file, site, addr string, upstreams map[string]string) (string, bool) {
	t.Helper()
	path := "../../deploy/caddy/" + file
	raw, _ := os.ReadFile(path)
	repl := map[string]string{site + " {": "http://" + addr + " {"}
	for k, v := range upstreams {
		if strings.Contains(string(raw), k) {
			repl[k] = v
		}
	}
	dir := t.TempDir()
	// No admin endpoint: several instances (other tests, other runs) at once.
	conf := "{\n\tadmin off\n}\n" + proxyFile(t, path, repl)
	if err := os.WriteFile(filepath.Join(dir, "Caddyfile"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/usr/bin/caddy", "run", "--config", filepath.Join(dir, "Caddyfile"), "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	return runProxy(t, "caddy "+file, cmd, addr, "")
}

// onFreePort runs start on a free loopback address, and again on another
// one (three tries in all) when start reports that another process took the
// port first (see freeAddr).
func onFreePort(t *testing.T, start func(addr string) (string, bool)) string {
	t.Helper()
	for attempt := 1; ; attempt++ {
		addr := freeAddr(t)
		if url, ok := start(addr); ok {
			return url
		}
		if attempt == 3 {
			t.Fatalf("no free port in %d tries", attempt)
		}
		t.Logf("another process took %s first; trying another port", addr)
	}
}

// runProxy starts a proxy and waits until it listens on addr; when the test
// failed, its output and accessLog (if any) are logged. It reports false,
// with the proxy stopped, when the proxy could not bind addr because
// another process had taken it: that process may answer a dial before the
// proxy gives up, so a proxy must still run a moment after the first dial
// succeeds.
func runProxy(t *testing.T, name string, cmd *exec.Cmd, addr, accessLog string) (string, bool) {
	t.Helper()
	out := &syncBuffer{}
	cmd.Stderr, cmd.Stdout = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		if t.Failed() {
			var log []byte
			if accessLog != "" {
				log, _ = os.ReadFile(accessLog)
			}
			t.Logf("%s (%s):\n%s%s", name, addr, out, log)
		}
	})
	taken := func() bool { return strings.Contains(strings.ToLower(out.String()), "address already in use") }
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			// A failed bind is logged at once (nginx then keeps retrying
			// for a few seconds before it exits).
			select {
			case <-done:
			case <-time.After(300 * time.Millisecond):
			}
			if !taken() {
				return "http://" + addr, true
			}
		}
		if taken() {
			_ = cmd.Process.Kill()
			return "", false
		}
		select {
		case <-done:
			t.Fatalf("%s exited:\n%s", name, out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not listen on %s:\n%s", name, addr, out)
		}
	}
}

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startHost starts the example host app (examples/host) with the JWT
// secret on a free port and waits until it answers. freeAddr's port is free
// when it returns, but another process (a parallel test's node or proxy)
// may bind it before the host does: uvicorn then exits with "address
// already in use" while the other process answers on the port. The host's
// own /healthz body ({"ok": true}) tells the two apart, and a host that
// could not bind is started again on another port.
func startHost(t *testing.T, secret string) (*pyProc, string) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		addr := freeAddr(t)
		_, port, _ := net.SplitHostPort(addr)
		host := startPython(t, "host", []string{"JWT_SECRET=" + secret}, "../../examples/host/app.py", "--port", port)
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if strings.Contains(host.stderr.String(), "address already in use") {
				break
			}
			var health struct {
				OK bool `json:"ok"`
			}
			if res, err := http.Get("http://" + addr + "/healthz"); err == nil {
				err = json.NewDecoder(res.Body).Decode(&health)
				res.Body.Close()
				if err == nil && res.StatusCode == 200 && health.OK {
					return host, addr
				}
			}
		}
		_ = host.cmd.Process.Kill()
		if attempt == 3 {
			t.Fatalf("the host app did not answer on a port of its own in %d tries; its stderr:\n%s", attempt, host.stderr)
		}
		t.Logf("the host app could not bind %s (another process took the port); trying another", addr)
	}
}

// pyProc is a running /usr/bin/python3.
type pyProc struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	lines  <-chan string // stdout
}

// startPython runs /usr/bin/python3 with args.
func startPython(t *testing.T, name string, env []string, args ...string) *pyProc {
	t.Helper()
	cmd := exec.Command("/usr/bin/python3", args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	var wg sync.WaitGroup
	wg.Go(func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, out)
		close(lines)
	})
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		wg.Wait()
		if t.Failed() {
			t.Logf("%s stderr:\n%s", name, stderr)
		}
	})
	return &pyProc{cmd: cmd, stderr: stderr, lines: lines}
}

// expect waits for a stdout line starting with prefix and returns the rest.
func (p *pyProc) expect(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("python exited before %q:\n%s", prefix, p.stderr)
			}
			if rest, ok := strings.CutPrefix(l, prefix); ok {
				return rest
			}
		case <-timeout:
			t.Fatalf("no %q within 20 s:\n%s", prefix, p.stderr)
		}
	}
}

// nodeRuns maps each node run (as session ids spell it: no dashes) to its
// node id.
func nodeRuns(t *testing.T, dbURL string) map[string]string {
	t.Helper()
	db, err := models.Open(t.Context(), dbURL, models.OpenOptions{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ns, err := db.Q(t.Context()).ListNodes()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, n := range ns {
		out[strings.ReplaceAll(n.Run, "-", "")] = n.NodeID
	}
	return out
}

// recovered reports whether a "$connect" recovered the socket's session.
func (e agentEvent) recovered() bool {
	var m struct{ Recovered bool }
	_ = json.Unmarshal(e.Payload, &m)
	return m.Recovered
}

// sessionRunOf is the node run named by a socket's Engine.IO session id.
func sessionRunOf(t *testing.T, ag *agent, sock string) string {
	t.Helper()
	res, err := ag.do(map[string]any{"op": "sid", "sock": sock})
	if err != nil {
		t.Fatal(err)
	}
	var sid string
	_ = json.Unmarshal(res, &sid)
	_, run, ok := strings.Cut(sid, ".")
	if !ok {
		t.Fatalf("%s: session id %q names no node", sock, sid)
	}
	return run
}
