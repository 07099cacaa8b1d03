package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
)

// env is one running API over a fresh database, with three callers:
// admin (superuser), alice and bob (regular users).
type env struct {
	t     testing.TB
	db    *models.DB
	svc   *joblib.Service
	bus   events.Bus
	rec   *recorder
	srv   *httptest.Server
	url   string
	admin string
	alice string
	bob   string
	rt    *server.Realtime
	api   *server.Server
}

type setupOpts struct {
	beforeStart func(*joblib.Service) // e.g. RegisterInternal
	settings    *joblib.Settings
	serverCfg   *server.Config
	publicReads bool
	realtime    *server.RealtimeConfig
	realtimeLog *slog.Logger
	bus         events.Bus
	logger      *slog.Logger
}

// withBus uses bus instead of a fresh in-process bus.
func withBus(b events.Bus) func(*setupOpts) {
	return func(o *setupOpts) { o.bus = b }
}

// withRealtime mounts the Socket.IO endpoint with cfg.
func withRealtime(cfg server.RealtimeConfig) func(*setupOpts) {
	return func(o *setupOpts) { o.realtime = &cfg }
}

func setup(t testing.TB, db *models.DB, opts ...func(*setupOpts)) *env {
	t.Helper()
	e := setupNoUsers(t, db, opts...)
	ctx := context.Background()
	var err error
	if e.admin, _, err = e.svc.CreateToken(ctx, "admin", true); err != nil {
		t.Fatal(err)
	}
	if e.alice, _, err = e.svc.CreateToken(ctx, "alice", false); err != nil {
		t.Fatal(err)
	}
	if e.bob, _, err = e.svc.CreateToken(ctx, "bob", false); err != nil {
		t.Fatal(err)
	}
	return e
}

// setupNoUsers starts the API without creating users.
func setupNoUsers(t testing.TB, db *models.DB, opts ...func(*setupOpts)) *env {
	t.Helper()
	var o setupOpts
	for _, f := range opts {
		f(&o)
	}
	st := joblib.DefaultSettings()
	if o.settings != nil {
		st = *o.settings
	}
	var bus events.Bus = events.NewLocalBus()
	if o.bus != nil {
		bus = o.bus
	}
	rec := &recorder{}
	unsub := bus.Subscribe(rec.add)
	svc := joblib.New(joblib.Config{DB: db, Bus: bus, Settings: st, Logger: o.logger})
	if o.beforeStart != nil {
		o.beforeStart(svc)
	}
	if err := svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	cfg := server.DefaultConfig()
	if o.serverCfg != nil {
		cfg = *o.serverCfg
	}
	cfg.PublicReads = cfg.PublicReads || o.publicReads
	api := server.New(svc, cfg, o.logger)
	var rt *server.Realtime
	if o.realtime != nil {
		rt = api.NewRealtime(*o.realtime, o.realtimeLog)
		api.Handle("/socket.io/", rt)
		_ = rt.Start(context.Background())
	}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(func() {
		if rt != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := rt.Shutdown(ctx); err != nil {
				t.Errorf("shutdown realtime: %v", err)
			}
		}
		srv.Close()
		unsub()
		svc.Close()
	})
	return &env{t: t, db: db, svc: svc, bus: bus, rec: rec, srv: srv, url: srv.URL, rt: rt, api: api}
}

func withSettings(f func(*joblib.Settings)) func(*setupOpts) {
	return func(o *setupOpts) {
		st := joblib.DefaultSettings()
		f(&st)
		o.settings = &st
	}
}

// resp is an HTTP answer.
type resp struct {
	t      testing.TB
	Status int
	Header http.Header
	Body   []byte
}

// JSON decodes the body into v.
func (r resp) JSON(v any) {
	r.t.Helper()
	if err := json.Unmarshal(r.Body, v); err != nil {
		r.t.Fatalf("decode %s: %v", r.Body, err)
	}
}

// M decodes the body as an object.
func (r resp) M() map[string]any {
	r.t.Helper()
	var m map[string]any
	r.JSON(&m)
	return m
}

// Items decodes a page's items.
func (r resp) Items() []map[string]any {
	r.t.Helper()
	var p struct {
		Items []map[string]any `json:"items"`
	}
	r.JSON(&p)
	return p.Items
}

// want fails the test unless the status matches.
func (r resp) want(status int) resp {
	r.t.Helper()
	if r.Status != status {
		r.t.Fatalf("status %d, want %d; body %s", r.Status, status, r.Body)
	}
	return r
}

// problem checks a problem+json answer of the given status and type slug.
func (r resp) problem(status int, slug string) map[string]any {
	r.t.Helper()
	r.want(status)
	if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
		r.t.Fatalf("content type %q, want application/problem+json; body %s", ct, r.Body)
	}
	m := r.M()
	if slug != "" && m["type"] != "/v1/problems/"+slug {
		r.t.Fatalf("problem type %v, want /v1/problems/%s", m["type"], slug)
	}
	if int(m["status"].(float64)) != status {
		r.t.Fatalf("problem status %v, want %d", m["status"], status)
	}
	return m
}

// do sends a request. body may be nil, a string (sent verbatim) or any value
// (JSON-encoded). hdr are extra "Name: value" headers.
func (e *env) do(token, method, path string, body any, hdr ...string) resp {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		buf, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(buf)
	}
	req, err := http.NewRequest(method, e.url+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, h := range hdr {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	res, err := apiClient.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp{t: e.t, Status: res.StatusCode, Header: res.Header, Body: b}
}

const api = "/v1/joblib"

// registerJob registers category:name in room as the caller and returns the response body.
func (e *env) registerJob(token, room, category, name string, extra ...map[string]any) map[string]any {
	e.t.Helper()
	body := map[string]any{"category": category, "name": name, "schema": map[string]any{}}
	for _, x := range extra {
		for k, v := range x {
			body[k] = v
		}
	}
	r := e.do(token, "PUT", api+"/rooms/"+room+"/jobs", body)
	if r.Status != 201 && r.Status != 200 {
		e.t.Fatalf("register %s:%s:%s: %d %s", room, category, name, r.Status, r.Body)
	}
	return r.M()
}

// submit submits a task and returns its id.
func (e *env) submit(token, room, fullName string, payload map[string]any) string {
	e.t.Helper()
	if payload == nil {
		payload = map[string]any{}
	}
	r := e.do(token, "POST", api+"/rooms/"+room+"/tasks/"+fullName, map[string]any{"payload": payload}).want(202)
	return r.M()["id"].(string)
}

// submitBatch submits one task per payload in one batch request and returns
// their ids in the payloads' order (the order they are claimed in).
func (e *env) submitBatch(token, room, fullName string, payloads []map[string]any) []string {
	e.t.Helper()
	items := make([]map[string]any, len(payloads))
	for i, p := range payloads {
		items[i] = map[string]any{"payload": p}
	}
	var ans struct {
		Tasks []struct {
			ID string `json:"id"`
		} `json:"tasks"`
	}
	e.do(token, "POST", api+"/rooms/"+room+"/tasks/"+fullName+"/batch", map[string]any{"tasks": items}).want(202).JSON(&ans)
	if len(ans.Tasks) != len(payloads) {
		e.t.Fatalf("a batch of %d made %d tasks", len(payloads), len(ans.Tasks))
	}
	ids := make([]string, len(ans.Tasks))
	for i, tk := range ans.Tasks {
		ids[i] = tk.ID
	}
	return ids
}

// claim claims for a worker and returns the task (nil when none).
func (e *env) claim(token, workerID string) map[string]any {
	e.t.Helper()
	r := e.do(token, "POST", api+"/tasks/claim", map[string]any{"worker_id": workerID}).want(200)
	t, _ := r.M()["task"].(map[string]any)
	return t
}

// patch changes a task's status.
func (e *env) patch(token, taskID, status string) resp {
	e.t.Helper()
	return e.do(token, "PATCH", api+"/tasks/"+taskID, map[string]any{"status": status})
}

// recorder keeps every published emission.
type recorder struct {
	mu  sync.Mutex
	ems []events.Emission
}

func (r *recorder) add(e events.Emission) {
	r.mu.Lock()
	r.ems = append(r.ems, e)
	r.mu.Unlock()
}

// take returns and forgets what was recorded.
func (r *recorder) take() []events.Emission {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.ems
	r.ems = nil
	return out
}

// of filters emissions by wire name.
func of(ems []events.Emission, name string) []events.Emission {
	var out []events.Emission
	for _, e := range ems {
		if e.Event.EventName() == name {
			out = append(out, e)
		}
	}
	return out
}

func each(t *testing.T, fn func(t *testing.T, e *env)) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		fn(t, setup(t, db))
	})
}

func waitFor(t testing.TB, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s", d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func postJSON(c *http.Client, url, token string, body, out any) error {
	buf, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequest("POST", url, bytes.NewReader(buf))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	res, err := c.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return err
	}
	if res.StatusCode != 200 {
		return fmt.Errorf("POST %s: %d %s", url, res.StatusCode, b)
	}
	return json.Unmarshal(b, out)
}
