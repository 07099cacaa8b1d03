package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// Fixtures shared by the conformance tests (the Python suite's conftest.py):
// seeded jobs, extra users, listing counts and wire-format checks.

// rotate is the job the Python suite's seeded_client registers.
const rotate = "@global:modifiers:Rotate"

// eachWith is each with setup options.
func eachWith(t *testing.T, opts []func(*setupOpts), fn func(t *testing.T, e *env)) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		fn(t, setup(t, db, opts...))
	})
}

// user issues a token for a new (or existing) user.
func (e *env) user(name string, superuser bool) string {
	e.t.Helper()
	tok, _, err := e.svc.CreateToken(context.Background(), name, superuser)
	if err != nil {
		e.t.Fatal(err)
	}
	return tok
}

// seed registers @global:modifiers:Rotate as the superuser (seeded_client)
// and returns the auto-created worker's id.
func (e *env) seed() string {
	e.t.Helper()
	r := e.do(e.admin, "PUT", api+"/rooms/@global/jobs", map[string]any{"category": "modifiers", "name": "Rotate", "schema": map[string]any{}}).want(201)
	return r.M()["worker_id"].(string)
}

// newWorker creates a worker for the caller and returns its id.
func (e *env) newWorker(token string) string {
	e.t.Helper()
	return e.do(token, "POST", api+"/workers", nil).want(201).M()["id"].(string)
}

// total reads a listing's total as the superuser.
func (e *env) total(path string) int {
	e.t.Helper()
	var p struct {
		Total *int `json:"total"`
	}
	e.do(e.admin, "GET", path, nil).want(200).JSON(&p)
	if p.Total == nil {
		e.t.Fatalf("GET %s: no total", path)
	}
	return *p.Total
}

// getTask reads a task as the superuser.
func (e *env) getTask(id string) map[string]any {
	e.t.Helper()
	return e.do(e.admin, "GET", api+"/tasks/"+id, nil).want(200).M()
}

// page decodes a listing envelope.
type page struct {
	Items  []map[string]any `json:"items"`
	Total  int              `json:"total"`
	Limit  int              `json:"limit"`
	Offset int              `json:"offset"`
}

func (r resp) page() page {
	r.t.Helper()
	var p page
	r.JSON(&p)
	if p.Items == nil {
		r.t.Fatalf("listing without items array: %s", r.Body)
	}
	return p
}

// field returns one field of every item.
func (p page) field(name string) []any {
	out := make([]any, len(p.Items))
	for i, it := range p.Items {
		out[i] = it[name]
	}
	return out
}

// rfc3339Z is the wire format of every timestamp: RFC 3339, UTC, ending in Z.
var rfc3339Z = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$`)

// wantTime fails unless v is an RFC 3339 UTC timestamp string ending in Z.
func wantTime(t testing.TB, what string, v any) time.Time {
	t.Helper()
	s, ok := v.(string)
	if !ok || !rfc3339Z.MatchString(s) {
		t.Fatalf("%s = %#v, want an RFC 3339 UTC timestamp ending in Z", what, v)
	}
	ts, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("%s = %q: %v", what, s, err)
	}
	return ts
}

// wantKeys fails unless m has exactly the given keys.
func wantKeys(t testing.TB, what string, m map[string]any, keys ...string) {
	t.Helper()
	want := map[string]bool{}
	for _, k := range keys {
		want[k] = true
		if _, ok := m[k]; !ok {
			t.Errorf("%s: field %q missing in %v", what, k, m)
		}
	}
	for k := range m {
		if !want[k] {
			t.Errorf("%s: unexpected field %q in %v", what, k, m)
		}
	}
}

// wantHasKeys fails unless m has at least the given keys.
func wantHasKeys(t testing.TB, what string, m map[string]any, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			t.Errorf("%s: field %q missing in %v", what, k, m)
		}
	}
}

// emitted is a recorded emission in comparable form.
type emitted struct {
	Name    string
	Room    string
	Payload map[string]any
}

func (e emitted) String() string { return fmt.Sprintf("%s→%s %v", e.Name, e.Room, e.Payload) }

// emissions takes what the recorder saw since the last call.
func (e *env) emissions() []emitted {
	e.t.Helper()
	var out []emitted
	for _, em := range e.rec.take() {
		var p map[string]any
		if err := json.Unmarshal(em.Payload(), &p); err != nil {
			e.t.Fatalf("payload of %s: %v", em.Event.EventName(), err)
		}
		out = append(out, emitted{Name: em.Event.EventName(), Room: em.Room, Payload: p})
	}
	return out
}

// named filters emissions by wire name.
func named(ems []emitted, name string) []emitted {
	var out []emitted
	for _, em := range ems {
		if em.Name == name {
			out = append(out, em)
		}
	}
	return out
}

// taskStatusFields are the fields of every task_status_event payload.
var taskStatusFields = []string{"id", "name", "room_id", "status", "created_at", "started_at", "completed_at", "queue_position", "worker_id", "error"}

// taskFields are the fields of the contract's TaskResponse.
var taskFields = []string{"id", "job_name", "room_id", "status", "created_at", "started_at", "completed_at", "worker_id", "error", "payload", "queue_position"}

// taskFieldsBeyond are the fields joblib adds to a task (optional for the
// contract's clients).
var taskFieldsBeyond = []string{"attempt", "result", "task_timeout", "heartbeat_timeout", "deadline_at", "progress", "progress_at", "priority", "run_at"}

func stringsReader(s string) io.Reader { return strings.NewReader(s) }

func decodeJSON(r io.Reader, v any) error { return json.NewDecoder(r).Decode(v) }
