package server_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/joblib"
)

// A provider result upload is checked in the Python server's order:
// credentials (401), the provider (404), its owner (403), and only then the
// request hash (422). A client whose provider is gone learns that first,
// whatever hash it sends.
func TestProviderUploadCheckOrder(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		id := e.provider(e.alice, "room-1", "filesystem", "local")
		missing := uuid.NewString()
		good := joblib.RequestHash(map[string]string{"path": "/"})
		for _, bad := range []string{"not-a-hash", strings.ToUpper(good)} {
			e.upload("", missing, bad, []byte("x")).problem(401, "unauthorized")
			m := e.upload(e.alice, missing, bad, []byte("x")).problem(404, "provider-not-found")
			if m["detail"] != "Provider '"+missing+"' not found" {
				t.Fatalf("detail %v", m["detail"])
			}
			m = e.upload(e.bob, id, bad, []byte("x")).problem(403, "forbidden")
			if m["detail"] != "Not authorized to upload results for this provider" {
				t.Fatalf("detail %v", m["detail"])
			}
			e.upload(e.alice, id, bad, []byte("x")).problem(422, "validation-error")
		}
		// A missing header is a request validation error, as FastAPI answers
		// it before the handler looks for the provider.
		e.do(e.alice, "POST", api+"/providers/"+missing+"/results", "x").problem(422, "validation-error")
		// Nothing was stored by the refused uploads; the owner's good one is.
		e.upload(e.alice, id, good, []byte(`{"ok":true}`)).want(204)
		r := e.readProvider(e.alice, "room-1", "room-1:filesystem:local", map[string]string{"path": "/"}).want(200)
		if string(r.Body) != `{"ok":true}` {
			t.Fatalf("read %s", r.Body)
		}
	})
}

// A room lists exactly the jobs its clients registered: no built-in
// internal job appears unless the server registered one (serve does so only
// with JOBLIB_BUILTIN_JOBS; see cmd/joblib).
func TestRoomListsOnlyRegisteredJobs(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		for _, n := range []string{"A", "B", "C"} {
			e.registerJob(e.alice, "room-1", "modifiers", n)
		}
		var page struct {
			Total int
			Items []struct {
				FullName string `json:"full_name"`
			}
		}
		e.do(e.alice, "GET", api+"/rooms/room-1/jobs", nil).want(200).JSON(&page)
		if page.Total != 3 || len(page.Items) != 3 {
			t.Fatalf("room lists %d jobs (%v), want the 3 registered", page.Total, page.Items)
		}
		for _, it := range page.Items {
			if strings.HasPrefix(it.FullName, "@internal") {
				t.Fatalf("room lists %s", it.FullName)
			}
		}
	})
}

// A worker may report a result with the completion; it is stored (compact
// JSON, capped) and returned by GET /tasks/{id}. As the Python server
// ignores fields it does not know, a result never makes a valid transition
// fail: it is ignored with any status but completed.
func TestTaskResultOnCompletion(t *testing.T) {
	t.Parallel()
	eachWith(t, []func(*setupOpts){withSettings(func(s *joblib.Settings) { s.TaskMaxResultBytes = 64 })}, func(t *testing.T, e *env) {
		w := e.registerJob(e.alice, "room-1", "modifiers", "Rotate")["worker_id"].(string)
		run := func() string {
			id := e.submit(e.alice, "room-1", "room-1:modifiers:Rotate", nil)
			if c := e.claim(e.alice, w); c == nil || c["id"] != id {
				t.Fatalf("claim %v", c)
			}
			e.patch(e.alice, id, "running").want(200)
			return id
		}
		result := func(id string) json.RawMessage {
			var tk struct{ Result json.RawMessage }
			e.do(e.alice, "GET", api+"/tasks/"+id, nil).want(200).JSON(&tk)
			return tk.Result
		}

		id := run()
		got := e.do(e.alice, "PATCH", api+"/tasks/"+id, `{"status":"completed","result":{"atoms": [1, 2, 3], "ok": true}}`).want(200).M()
		want := `{"atoms":[1,2,3],"ok":true}`
		if b, _ := json.Marshal(got["result"]); string(b) != want {
			t.Fatalf("PATCH answered result %s, want %s", b, want)
		}
		if r := result(id); string(r) != want {
			t.Fatalf("GET result %s, want %s", r, want)
		}

		// Too large: 413, nothing changes, the worker may retry smaller.
		id = run()
		big := `{"status":"completed","result":"` + strings.Repeat("x", 70) + `"}`
		e.do(e.alice, "PATCH", api+"/tasks/"+id, big).problem(413, "")
		var tk struct{ Status string }
		e.do(e.alice, "GET", api+"/tasks/"+id, nil).want(200).JSON(&tk)
		if tk.Status != "running" {
			t.Fatalf("refused completion left the task %s", tk.Status)
		}
		e.do(e.alice, "PATCH", api+"/tasks/"+id, `{"status":"completed","result":[1]}`).want(200)
		if r := result(id); string(r) != `[1]` {
			t.Fatalf("result %s", r)
		}

		// Without a result, with null, or with another status: no result.
		for _, body := range []string{`{"status":"completed"}`, `{"status":"completed","result":null}`,
			`{"status":"failed","error":"boom","result":{"partial":1}}`} {
			id = run()
			e.do(e.alice, "PATCH", api+"/tasks/"+id, body).want(200)
			if r := result(id); string(r) != "null" && len(r) != 0 {
				t.Fatalf("%s stored result %s", body, r)
			}
		}
	})
}
