// Package deploy holds the deployment artefacts (Dockerfile at the
// repository root, compose file, systemd unit, Prometheus rules, Grafana
// dashboard); its test checks them with the tools available without a
// container engine.
package deploy

import (
	"bufio"
	"context"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
)

// dockerfile parses ../Dockerfile into instructions (continuation lines
// joined), grouped by stage.
func dockerfile(t *testing.T) [][]string {
	t.Helper()
	f, err := os.Open("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var stages [][]string
	var cur strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if s, ok := strings.CutSuffix(line, "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(line)
		ins := cur.String()
		cur.Reset()
		if strings.HasPrefix(ins, "FROM ") {
			stages = append(stages, nil)
		}
		if len(stages) == 0 {
			t.Fatalf("instruction before FROM: %s", ins)
		}
		stages[len(stages)-1] = append(stages[len(stages)-1], ins)
	}
	return stages
}

// The Dockerfile is multi-stage, runs as a non-root user with a health
// check, and its build command — run here word for word — gives a static
// binary that reports the version and commit it was given.
func TestDockerfileStaticBuild(t *testing.T) {
	t.Parallel()
	stages := dockerfile(t)
	if len(stages) < 2 {
		t.Fatalf("%d stage(s), want a build stage and a runtime stage", len(stages))
	}
	var build string
	for _, ins := range stages[0] {
		if strings.HasPrefix(ins, "RUN CGO_ENABLED=0 go build ") {
			build = strings.TrimPrefix(ins, "RUN ")
		}
	}
	if build == "" {
		t.Fatal("the build stage has no RUN CGO_ENABLED=0 go build")
	}
	final := stages[len(stages)-1]
	has := func(prefix string) string {
		for _, ins := range final {
			if strings.HasPrefix(ins, prefix) {
				return ins
			}
		}
		return ""
	}
	if u := has("USER "); u == "" || strings.HasPrefix(u, "USER root") || strings.HasPrefix(u, "USER 0") {
		t.Fatalf("runtime stage user %q, want a non-root one", u)
	}
	if hc := has("HEALTHCHECK "); !strings.Contains(hc, `"/usr/local/bin/joblib", "health"`) {
		t.Fatalf("health check %q", hc)
	}
	if !strings.Contains(has("COPY --from="), "/out/joblib /usr/local/bin/joblib") {
		t.Fatal("the runtime stage does not take the built binary")
	}

	out := filepath.Join(t.TempDir(), "joblib")
	cmdline := strings.NewReplacer("${VERSION}", "v0.0.0-deploytest", "${COMMIT}", "abc1234", "/out/joblib", out).Replace(build)
	cmd := exec.Command("sh", "-c", cmdline)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmdline, err, b)
	}
	ef, err := elf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Fatal("the binary is dynamically linked")
		}
	}
	v, err := exec.Command(out, "--version").Output()
	if err != nil || !strings.HasPrefix(string(v), "joblib v0.0.0-deploytest (commit abc1234, go1.") {
		t.Fatalf("--version: %q %v", v, err)
	}
}

// yamlFile decodes a YAML file through Python's yaml (no Go YAML
// dependency), into v.
func yamlFile(t *testing.T, path string, v any) {
	t.Helper()
	b, err := exec.Command("python3", "-c", "import json,sys,yaml; json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)", path).Output()
	if err != nil {
		var ee *exec.ExitError
		if errorsAs(err, &ee) {
			t.Fatalf("parse %s: %s", path, ee.Stderr)
		}
		t.Fatalf("parse %s: %v (scripts/test.sh installs python3-yaml)", path, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}

func errorsAs(err error, target **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	if ok {
		*target = e
	}
	return ok
}

// The compose file runs PostgreSQL (with a health check the nodes wait
// for) and two joblib nodes built from the Dockerfile, on the same database
// with distinct node ids.
func TestComposeFile(t *testing.T) {
	t.Parallel()
	var c struct {
		Services map[string]struct {
			Build *struct {
				Context    string `json:"context"`
				Dockerfile string `json:"dockerfile"`
			} `json:"build"`
			Image       string            `json:"image"`
			Environment map[string]string `json:"environment"`
			DependsOn   map[string]struct {
				Condition string `json:"condition"`
			} `json:"depends_on"`
			Healthcheck map[string]any `json:"healthcheck"`
			Ports       []string       `json:"ports"`
		} `json:"services"`
	}
	yamlFile(t, "compose.yaml", &c)
	pg, ok := c.Services["postgres"]
	if !ok || !strings.HasPrefix(pg.Image, "postgres:") || pg.Healthcheck == nil {
		t.Fatalf("postgres service %+v", pg)
	}
	var nodes, urls []string
	for name, s := range c.Services {
		if name == "postgres" {
			continue
		}
		if s.Build == nil || filepath.Join(s.Build.Context, s.Build.Dockerfile) != "../Dockerfile" {
			t.Fatalf("%s is not built from the Dockerfile: %+v", name, s.Build)
		}
		if _, err := os.Stat(filepath.Join(s.Build.Context, s.Build.Dockerfile)); err != nil {
			t.Fatal(err)
		}
		if s.DependsOn["postgres"].Condition != "service_healthy" {
			t.Fatalf("%s does not wait for a healthy postgres", name)
		}
		u := s.Environment["JOBLIB_DATABASE_URL"]
		if !strings.HasPrefix(u, "postgres://") || !strings.Contains(u, "@postgres:5432/") {
			t.Fatalf("%s database %q", name, u)
		}
		if len(s.Ports) != 1 {
			t.Fatalf("%s ports %v", name, s.Ports)
		}
		nodes = append(nodes, s.Environment["JOBLIB_NODE_ID"])
		urls = append(urls, u)
	}
	slices.Sort(nodes)
	if len(nodes) != 2 || nodes[0] == "" || nodes[0] == nodes[1] || urls[0] != urls[1] {
		t.Fatalf("want two nodes with distinct ids on one database: %v %v", nodes, urls)
	}
}

// The systemd unit passes systemd-analyze verify (with the unit's binary
// path pointing at a real file) without a single complaint, and keeps its
// hardening.
func TestSystemdUnit(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("systemd/joblib.service")
	if err != nil {
		t.Fatal(err)
	}
	unit := string(raw)
	for _, want := range []string{"ExecStart=/usr/local/bin/joblib serve", "DynamicUser=yes", "StateDirectory=joblib",
		"NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes", "PrivateDevices=yes",
		"CapabilityBoundingSet=\n", "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX", "MemoryDenyWriteExecute=yes",
		"SystemCallFilter=@system-service", "KillSignal=SIGTERM"} {
		if !strings.Contains(unit, want) {
			t.Fatalf("unit lacks %q", strings.TrimSpace(want))
		}
	}
	bin, err := os.Executable() // any existing executable stands in for joblib
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "joblib.service")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(unit, "/usr/local/bin/joblib", bin)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("systemd-analyze", "verify", path).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify (scripts/test.sh installs systemd): %v\n%s", err, out)
	}
}

// The alert rules are valid and behave as their unit tests say (promtool,
// from Debian's prometheus package, which scripts/test.sh installs).
func TestPrometheusRules(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"check", "rules", "joblib-alerts.yml"}, {"test", "rules", "joblib-alerts_test.yml"}} {
		cmd := exec.Command("promtool", args...)
		cmd.Dir = "prometheus"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

var metricRef = regexp.MustCompile(`\bjoblib_[a-z_]+`)

// Every metric the alerts and the dashboard query is one joblib exports.
func TestRulesAndDashboardUseExportedMetrics(t *testing.T) {
	t.Parallel()
	exported := exportedMetrics(t)
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	raw, err := os.ReadFile("grafana/joblib-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	if len(dash.Panels) == 0 {
		t.Fatal("dashboard without panels")
	}
	var exprs []string
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Fatalf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	var rules struct {
		Groups []struct {
			Rules []struct{ Expr string }
		}
	}
	yamlFile(t, "prometheus/joblib-alerts.yml", &rules)
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
		}
	}
	used := map[string]bool{}
	for _, e := range exprs {
		for _, m := range metricRef.FindAllString(e, -1) {
			used[m] = true
			base := m
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(m, suf); ok && exported[b] {
					base = b
				}
			}
			if !exported[base] {
				t.Errorf("%q queries %s, which joblib does not export", e, m)
			}
		}
	}
	for _, must := range []string{"joblib_sweeper_leader", "joblib_workers_cleaned_total", "joblib_false_positives_total",
		"joblib_worker_detection_latency_seconds_bucket", "joblib_socket_disconnects_total"} {
		if !used[must] {
			t.Errorf("no alert or panel uses %s", must)
		}
	}
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// exportedMetrics lists the metric names a serving node registers.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	db := dbtest.Open(t, models.SQLite)
	svc := joblib.New(joblib.Config{DB: db})
	t.Cleanup(svc.Close)
	reg := prometheus.NewRegistry()
	m, err := server.NewMetrics(reg, svc)
	if err != nil {
		t.Fatal(err)
	}
	rt := server.New(svc, server.DefaultConfig(), nil).NewRealtime(server.DefaultRealtimeConfig(), nil)
	t.Cleanup(func() { _ = rt.Shutdown(context.Background()) })
	names := map[string]bool{}
	descs := make(chan *prometheus.Desc, 64)
	for _, c := range []prometheus.Collector{m.WorkersCleaned, m.DetectionLatency, m.FalsePositives, m.Sweeps,
		m.SweepDuration, m.SweeperLeader, server.SocketCollector(rt)} {
		c.Describe(descs)
	}
	close(descs)
	for d := range descs {
		if s := fqName.FindStringSubmatch(d.String()); s != nil {
			names[s[1]] = true
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	return names
}

// proxyFiles lists the proxy configurations of one kind (nginx, caddy).
func proxyFiles(t *testing.T, glob string) []string {
	t.Helper()
	files, err := filepath.Glob(glob)
	if err != nil || len(files) < 2 {
		t.Fatalf("%s: %v %v, want both layouts (own origin, one origin)", glob, files, err)
	}
	return files
}

// nginxTest runs `nginx -t` (Debian's nginx, installed by scripts/test.sh)
// on a main configuration that includes file, in a private prefix: the way
// a user drops the file into /etc/nginx/conf.d/.
func nginxTest(t *testing.T, file string) {
	t.Helper()
	abs, err := filepath.Abs(file)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	main := filepath.Join(dir, "nginx.conf")
	conf := "pid " + filepath.Join(dir, "nginx.pid") + ";\nerror_log stderr;\nevents {}\nhttp {\n    include " + abs + ";\n}\n"
	if err := os.WriteFile(main, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(nginxBinary(), "-t", "-p", dir, "-c", main, "-e", "stderr").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "test is successful") {
		t.Fatalf("nginx -t with %s (scripts/test.sh installs Debian's nginx): %v\n%s", file, err, out)
	}
}

// nginxBinary is Debian's nginx, also when /usr/sbin is not on PATH.
func nginxBinary() string {
	if p, err := exec.LookPath("nginx"); err == nil {
		return p
	}
	return "/usr/sbin/nginx"
}

var (
	nginxTimeout = regexp.MustCompile(`(?m)^\s*proxy_(read|send)_timeout\s+(\S+);`)
	caddyTimeout = regexp.MustCompile(`(?m)^\s*read_timeout\s+(\S+)$`)
)

// longestHold is the longest joblib keeps a proxied request or socket
// silent with its default settings: a long-poll's longest Prefer: wait, and
// a websocket between two pings plus the ping timeout. A proxy read timeout
// must exceed both, or it cuts them off with a 504 or a closed socket.
func longestHold() time.Duration {
	st := joblib.DefaultSettings()
	rt := server.DefaultRealtimeConfig()
	return max(st.LongPollMaxWait, st.ProviderLongPollMax, rt.PingInterval+rt.PingTimeout)
}

// The nginx configurations of both layouts pass nginx -t, upgrade
// websockets, keep Host, forward the client address, do not buffer, allow
// joblib's largest bodies and read longer than joblib holds a request.
func TestNginxConfigs(t *testing.T) {
	t.Parallel()
	for _, f := range proxyFiles(t, "nginx/*.conf") {
		t.Run(filepath.Base(f), func(t *testing.T) {
			t.Parallel()
			nginxTest(t, f)
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			conf := string(raw)
			for _, want := range []string{"proxy_http_version 1.1;", "proxy_set_header Upgrade $http_upgrade;",
				"proxy_set_header Connection $connection_upgrade;", "proxy_set_header Host $http_host;",
				"proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;", "proxy_buffering off;",
				"client_max_body_size 16m;", "upstream joblib {"} {
				if !strings.Contains(conf, want) {
					t.Errorf("%s lacks %q", f, want)
				}
			}
			if n := strings.Count(conf[strings.Index(conf, "upstream joblib {"):], "\n    server 127.0.0.1:"); n < 2 {
				t.Errorf("%s: %d joblib nodes upstream, want two or more", f, n)
			}
			ts := nginxTimeout.FindAllStringSubmatch(conf, -1)
			if len(ts) == 0 {
				t.Fatalf("%s sets no proxy_read_timeout (nginx's default, 60 s, is not above %s)", f, longestHold())
			}
			for _, m := range ts {
				if d, err := time.ParseDuration(m[2]); err != nil || d <= longestHold() {
					t.Errorf("%s: proxy_%s_timeout %s, want above %s", f, m[1], m[2], longestHold())
				}
			}
		})
	}
}

// The Caddy configurations of both layouts pass caddy validate (Debian's
// caddy, installed by scripts/test.sh), balance over two or more nodes
// and read longer than joblib holds a request.
func TestCaddyConfigs(t *testing.T) {
	t.Parallel()
	for _, f := range proxyFiles(t, "caddy/*.Caddyfile") {
		t.Run(filepath.Base(f), func(t *testing.T) {
			t.Parallel()
			home := t.TempDir() // caddy keeps its state under $HOME / XDG dirs
			cmd := exec.Command("caddy", "validate", "--config", f, "--adapter", "caddyfile")
			cmd.Env = append(os.Environ(), "HOME="+home, "XDG_DATA_HOME="+home, "XDG_CONFIG_HOME="+home)
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), "Valid configuration") {
				t.Fatalf("caddy validate %s (scripts/test.sh installs Debian's caddy): %v\n%s", f, err, out)
			}
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			conf := string(raw)
			for _, want := range []string{"reverse_proxy 127.0.0.1:8081 127.0.0.1:8082 {", "flush_interval -1", "health_uri /readyz", "max_size 16MB"} {
				if !strings.Contains(conf, want) {
					t.Errorf("%s lacks %q", f, want)
				}
			}
			ts := caddyTimeout.FindAllStringSubmatch(conf, -1)
			if len(ts) == 0 {
				t.Errorf("%s sets no transport read_timeout", f)
			}
			for _, m := range ts {
				if d, err := time.ParseDuration(m[1]); err != nil || d <= longestHold() {
					t.Errorf("%s: read_timeout %s, want above %s", f, m[1], longestHold())
				}
			}
		})
	}
}
