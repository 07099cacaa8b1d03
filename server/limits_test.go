package server_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/zndraw/joblib/internal/limits"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
)

// logRecorder keeps every log record (level and rendered text).
type logRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
	buf  bytes.Buffer
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r)
	l.buf.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		l.buf.WriteString(" " + a.String())
		return true
	})
	l.buf.WriteString("\n")
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

// above returns the records logged above WARN.
func (l *logRecorder) above(level slog.Level) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.recs {
		if r.Level > level {
			out = append(out, r.Message)
		}
	}
	return out
}

func (l *logRecorder) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// Bad bytes are the client's error on both databases: invalid UTF-8, NUL,
// unpaired surrogates, numbers out of range and nesting past
// JOBLIB_MAX_JSON_DEPTH answer 422 problem+json, store nothing, count in
// joblib_limit_rejections_total, and are never logged above WARN nor with
// the payload.
func TestBadBytesAreTheClientsError(t *testing.T) {
	t.Parallel()
	logs := &logRecorder{}
	opts := []func(*setupOpts){func(o *setupOpts) { o.logger = slog.New(logs) }}
	eachWith(t, opts, func(t *testing.T, e *env) {
		e.seed()
		submit := api + "/rooms/room/tasks/" + rotate
		jobs := api + "/rooms/room/jobs"
		const marker = "SECRET-PAYLOAD-MARKER"
		deep := func(n int) string { return strings.Repeat(`{"a":`, n) + `"` + marker + `"` + strings.Repeat("}", n) }
		cases := []struct {
			name, method, path, body string
			limit                    string
		}{
			{"invalid UTF-8 in payload", "POST", submit, "{\"payload\":{\"x\":\"" + marker + "\xff\xfe\"}}", limits.JSONBytes},
			{"invalid UTF-8 in schema", "PUT", jobs, "{\"category\":\"modifiers\",\"name\":\"X\",\"schema\":{\"t\":\"" + marker + "\xc3\"}}", limits.JSONBytes},
			{"NUL in payload", "POST", submit, `{"payload":{"x":"` + marker + `\u0000"}}`, limits.JSONBytes},
			{"NUL in payload key", "POST", submit, `{"payload":{"\u0000":"` + marker + `"}}`, limits.JSONBytes},
			{"lone surrogate in payload", "POST", submit, `{"payload":{"x":"` + marker + `\ud800"}}`, limits.JSONBytes},
			{"huge exponent in payload", "POST", submit, `{"payload":{"x":1e999999,"m":"` + marker + `"}}`, limits.JSONBytes},
			{"huge integer in payload", "POST", submit, `{"payload":{"x":` + strings.Repeat("7", 5000) + `}}`, limits.JSONBytes},
			{"nesting 10000 deep", "POST", submit, `{"payload":` + deep(10000) + `}`, limits.JSONDepth},
			{"nesting one past the budget", "POST", submit, `{"payload":` + deep(64) + `}`, limits.JSONDepth},
			{"deep schema", "PUT", jobs, `{"category":"modifiers","name":"X","schema":` + deep(100) + `}`, limits.JSONDepth},
			{"max_attempts 3e9", "PUT", jobs, `{"category":"modifiers","name":"X","on_worker_loss":"requeue","max_attempts":3e9}`, ""},
			{"max_attempts 3000000000", "PUT", jobs, `{"category":"modifiers","name":"X","on_worker_loss":"requeue","max_attempts":3000000000}`, ""},
			{"max_attempts past int64", "PUT", jobs, `{"category":"modifiers","name":"X","on_worker_loss":"requeue","max_attempts":99999999999999999999}`, ""},
		}
		rej := e.api.Rejections()
		for _, c := range cases {
			before := rej.Value(c.limit)
			e.do(e.admin, c.method, c.path, c.body).problem(422, "validation-error")
			if c.limit != "" && rej.Value(c.limit) != before+1 {
				t.Errorf("%s: rejections{%s} %v → %v, want +1", c.name, c.limit, before, rej.Value(c.limit))
			}
		}
		if n := e.total(api + "/rooms/room/tasks"); n != 0 {
			t.Fatalf("%d tasks stored from rejected submissions", n)
		}
		if n := e.total(jobs); n != 1 { // the seeded @global job only
			t.Fatalf("%d jobs visible, want 1 (nothing registered)", n)
		}
		// Within the budget is fine: the body's object plus 63 levels.
		e.do(e.admin, "POST", submit, `{"payload":`+deep(63)+`}`).want(202)
		e.do(e.admin, "PUT", jobs, `{"category":"modifiers","name":"X","on_worker_loss":"requeue","max_attempts":1000}`).want(201)
		// Good Unicode is stored and read back unchanged.
		id := e.submit(e.admin, "room", rotate, map[string]any{"s": "héllo ☃ 😀"})
		if got := e.getTask(id)["payload"].(map[string]any); got["s"] != "héllo ☃ 😀" {
			t.Fatalf("payload read back as %v", got)
		}
	})
	if bad := logs.above(slog.LevelWarn); len(bad) != 0 {
		t.Errorf("client errors logged above WARN: %v", bad)
	}
	if strings.Contains(logs.text(), "SECRET-PAYLOAD-MARKER") {
		t.Errorf("a rejected payload reached the logs:\n%s", logs.text())
	}
}

// The JSON depth budget is configurable: JOBLIB_MAX_JSON_DEPTH=4 refuses a
// payload three levels deep inside the body.
func TestJSONDepthBudgetIsConfigurable(t *testing.T) {
	t.Parallel()
	cfg := server.DefaultConfig()
	cfg.MaxJSONDepth = 4
	eachWith(t, []func(*setupOpts){func(o *setupOpts) { o.serverCfg = &cfg }}, func(t *testing.T, e *env) {
		e.seed()
		submit := api + "/rooms/room/tasks/" + rotate
		e.do(e.admin, "POST", submit, `{"payload":{"a":{"b":[1]}}}`).want(202)
		p := e.do(e.admin, "POST", submit, `{"payload":{"a":{"b":{"c":[]}}}}`).problem(422, "validation-error")
		if !strings.Contains(p["detail"].(string), "more than 4 levels") {
			t.Fatalf("detail %q does not name the budget", p["detail"])
		}
	})
}

// holdDatabase makes every listing statement wait until release is called:
// on PostgreSQL another session holds an exclusive lock on tasks, on SQLite
// a transaction holds the single connection.
func holdDatabase(t *testing.T, e *env) (release func()) {
	t.Helper()
	ctx := context.Background()
	if e.db.Dialect() == models.Postgres {
		conn, err := pgx.Connect(ctx, e.db.URL())
		if err != nil {
			t.Fatal(err)
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "LOCK TABLE tasks IN ACCESS EXCLUSIVE MODE"); err != nil {
			t.Fatal(err)
		}
		return func() { _ = tx.Rollback(ctx); _ = conn.Close(ctx) }
	}
	held, done := make(chan struct{}), make(chan struct{})
	stop := make(chan struct{})
	go func() {
		defer close(done)
		_ = e.db.Tx(ctx, func(*models.Q) error { close(held); <-stop; return nil })
	}()
	<-held
	return func() { close(stop); <-done }
}

// A listing past its database time budget (JOBLIB_READ_DB_TIMEOUT) is
// cancelled and answers 503 statement-timeout with Retry-After, counted in
// joblib_limit_rejections_total; the server keeps serving, and the same
// listing succeeds once the database is free again.
func TestListingPastItsDatabaseBudgetIsCancelled(t *testing.T) {
	t.Parallel()
	cfg := server.DefaultConfig()
	cfg.ReadDBTimeout = 300 * time.Millisecond
	eachWith(t, []func(*setupOpts){func(o *setupOpts) { o.serverCfg = &cfg; o.publicReads = true }}, func(t *testing.T, e *env) {
		e.seed()
		e.submit(e.admin, "room", rotate, nil)
		var once sync.Once
		hold := holdDatabase(t, e)
		release := func() { once.Do(hold) }
		// Without the budget the listing would wait for the lock; it is
		// let go after 10 s so that such a bug fails instead of hanging.
		time.AfterFunc(10*time.Second, release)
		start := time.Now()
		r := e.do("", "GET", api+"/rooms/room/tasks", nil)
		took := time.Since(start)
		release()
		r.problem(503, "statement-timeout")
		if r.Header.Get("Retry-After") == "" {
			t.Error("no Retry-After on a statement timeout")
		}
		// Generous bound: the budget is 300 ms.
		if took > 8*time.Second {
			t.Fatalf("listing took %s", took)
		}
		if v := e.api.Rejections().Value(limits.StatementTimeout); v != 1 {
			t.Fatalf("rejections{statement_timeout} = %v, want 1", v)
		}
		// Once the lock is gone the listing answers again. On a loaded
		// machine (CI) even the free listing can once take longer than the
		// 300 ms budget, so a 503 is retried; a server that stayed broken
		// never answers 200.
		var r2 resp
		for end := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if r2 = e.do("", "GET", api+"/rooms/room/tasks", nil); r2.Status != 503 || time.Now().After(end) {
				break
			}
		}
		r2.want(200)
		e.do(e.admin, "GET", "/readyz", nil).want(200)
	})
}

// The deepest offset a listing accepts is JOBLIB_MAX_LIST_OFFSET; offsets up
// to it keep working (contract clients page with them), deeper ones answer
// 422 before any statement runs.
func TestListOffsetBudget(t *testing.T) {
	t.Parallel()
	cfg := server.DefaultConfig()
	cfg.MaxListOffset = 100
	eachWith(t, []func(*setupOpts){func(o *setupOpts) { o.serverCfg = &cfg }}, func(t *testing.T, e *env) {
		e.seed()
		for _, path := range []string{"/workers", "/rooms/room/jobs", "/rooms/room/tasks", "/rooms/room/workers",
			"/rooms/room/providers", "/rooms/room/jobs/" + rotate + "/tasks"} {
			e.do(e.admin, "GET", api+path+"?offset=100", nil).want(200)
			p := e.do(e.admin, "GET", api+path+"?offset=101", nil).problem(422, "validation-error")
			if !strings.Contains(p["detail"].(string), "at most 100") {
				t.Errorf("%s: detail %q", path, p["detail"])
			}
		}
		if v := e.api.Rejections().Value(limits.ListOffset); v != 6 {
			t.Fatalf("rejections{list_offset} = %v, want 6", v)
		}
	})
}

// slowBody sends body in pieces over about d.
func slowBody(body []byte, d time.Duration) io.Reader {
	pr, pw := io.Pipe()
	go func() {
		const pieces = 5
		step := (len(body) + pieces - 1) / pieces
		for i := 0; i < len(body); i += step {
			time.Sleep(d / pieces)
			if _, err := pw.Write(body[i:min(i+step, len(body))]); err != nil {
				return
			}
		}
		pw.Close()
	}()
	return pr
}

// The database time budget counts from the end of the request body: a
// client on a slow link whose body takes longer than the budget to arrive
// is served normally.
func TestSlowBodyDoesNotSpendTheDatabaseBudget(t *testing.T) {
	t.Parallel()
	cfg := server.DefaultConfig()
	// The body takes twice the budget to arrive; the budget itself leaves the
	// statements room under -race on a loaded machine (1 s once ran out on
	// a CI machine whose disk stalled its commits).
	cfg.WriteDBTimeout = 2 * time.Second
	eachWith(t, []func(*setupOpts){func(o *setupOpts) { o.serverCfg = &cfg }}, func(t *testing.T, e *env) {
		e.seed()
		post := func(path string, body []byte, hdr ...string) int {
			req, err := http.NewRequest("POST", e.url+path, slowBody(body, 2*cfg.WriteDBTimeout))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+e.admin)
			for _, h := range hdr {
				k, v, _ := strings.Cut(h, ":")
				req.Header.Set(k, strings.TrimSpace(v))
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			return res.StatusCode
		}
		if st := post(api+"/rooms/room/tasks/"+rotate, []byte(`{"payload":{"a":"`+strings.Repeat("x", 5000)+`"}}`)); st != 202 {
			t.Fatalf("slow submission: %d", st)
		}
		pid := e.provider(e.admin, "room", "filesystem", "slow")
		hash := strings.Repeat("a", 64)
		if st := post(api+"/providers/"+pid+"/results", []byte(strings.Repeat("r", 5000)), "X-Request-Hash: "+hash); st != 204 {
			t.Fatalf("slow upload: %d", st)
		}
	})
}
