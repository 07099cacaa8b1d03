package server_test

import (
	"strconv"
	"strings"
	"testing"
)

// noise returns n bytes of text that compresses badly (PostgreSQL compresses
// repetitive index entries, which would hide a size limit).
func noise(n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		b.WriteString(strconv.Itoa(i * 7919 % 10007))
	}
	return b.String()[:n]
}

// badRequest is one malformed request and the problem it must answer.
type badRequest struct {
	name         string
	method, path string
	body         any // string bodies are sent verbatim
	status       int
	slug         string
}

// state is what the listings show; a rejected request must not change it.
type state struct {
	workers, jobs, roomTasks, pending, claimed, running int
	claimedTask, pendingTask                            map[string]any
}

func (e *env) state(claimedID, pendingID string) state {
	e.t.Helper()
	return state{
		workers:     e.total(api + "/workers"),
		jobs:        e.total(api + "/rooms/room/jobs"),
		roomTasks:   e.total(api + "/rooms/room/tasks"),
		pending:     e.total(api + "/rooms/room/tasks?status=pending"),
		claimed:     e.total(api + "/rooms/room/tasks?status=claimed"),
		running:     e.total(api + "/rooms/room/tasks?status=running"),
		claimedTask: e.getTask(claimedID),
		pendingTask: e.getTask(pendingID),
	}
}

func sameTask(a, b map[string]any) bool {
	for _, k := range []string{"status", "worker_id", "started_at", "completed_at", "error", "queue_position"} {
		if a[k] != b[k] {
			return false
		}
	}
	return true
}

func (s state) equal(o state) bool {
	return s.workers == o.workers && s.jobs == o.jobs && s.roomTasks == o.roomTasks && s.pending == o.pending &&
		s.claimed == o.claimed && s.running == o.running && sameTask(s.claimedTask, o.claimedTask) && sameTask(s.pendingTask, o.pendingTask)
}

// Bad input never answers 500 and never changes state: every malformed
// request per endpoint answers its problem+json (422 validation-error for
// request validation, DESIGN improvement 5), the listings are unchanged and
// nothing is emitted.
func TestBadInputIsRejectedWithoutEffect(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w := e.seed()
		claimedID := e.submit(e.admin, "room", rotate, nil)
		if c := e.claim(e.admin, w); c["id"] != claimedID {
			t.Fatalf("claim %v", c)
		}
		pendingID := e.submit(e.admin, "room", rotate, nil)
		before := e.state(claimedID, pendingID)
		e.emissions()

		jobs := api + "/rooms/room/jobs"
		submit := api + "/rooms/room/tasks/" + rotate
		claim := api + "/tasks/claim"
		task := api + "/tasks/" + claimedID
		const v = "validation-error"
		cases := []badRequest{
			// PATCH/DELETE /workers/{id}
			{"heartbeat non-UUID", "PATCH", api + "/workers/not-a-uuid", nil, 422, v},
			{"heartbeat short id", "PATCH", api + "/workers/123", nil, 422, v},
			{"delete non-UUID", "DELETE", api + "/workers/not-a-uuid", nil, 422, v},

			// PUT /rooms/{room}/jobs
			{"register no body", "PUT", jobs, "", 422, v},
			{"register malformed JSON", "PUT", jobs, `{"category":`, 422, v},
			{"register array", "PUT", jobs, `[]`, 422, v},
			{"register string", "PUT", jobs, `"modifiers"`, 422, v},
			{"register null", "PUT", jobs, `null`, 422, v},
			{"register trailing garbage", "PUT", jobs, `{"category":"modifiers","name":"X"} x`, 422, v},
			{"register missing category", "PUT", jobs, map[string]any{"name": "X"}, 422, v},
			{"register missing name", "PUT", jobs, map[string]any{"category": "modifiers"}, 422, v},
			{"register null name", "PUT", jobs, map[string]any{"category": "modifiers", "name": nil}, 422, v},
			{"register numeric category", "PUT", jobs, map[string]any{"category": 5, "name": "X"}, 422, v},
			{"register numeric name", "PUT", jobs, map[string]any{"category": "modifiers", "name": 5}, 422, v},
			{"register string schema", "PUT", jobs, map[string]any{"category": "modifiers", "name": "X", "schema": "x"}, 422, v},
			{"register array schema", "PUT", jobs, map[string]any{"category": "modifiers", "name": "X", "schema": []any{}}, 422, v},
			{"register null schema", "PUT", jobs, map[string]any{"category": "modifiers", "name": "X", "schema": nil}, 422, v},
			{"register non-UUID worker", "PUT", jobs, map[string]any{"category": "modifiers", "name": "X", "worker_id": "nope"}, 422, v},
			{"register numeric worker", "PUT", jobs, map[string]any{"category": "modifiers", "name": "X", "worker_id": 5}, 422, v},
			{"register bad policy", "PUT", jobs, map[string]any{"category": "modifiers", "name": "X", "on_worker_loss": "explode"}, 422, v},
			{"register bad attempts", "PUT", jobs, map[string]any{"category": "modifiers", "name": "X", "max_attempts": "many"}, 422, v},
			{"register keys in other case", "PUT", jobs, `{"Category":"modifiers","NAME":"X"}`, 422, v},
			{"register bad category value", "PUT", jobs, map[string]any{"category": "bogus", "name": "X"}, 400, "invalid-category"},
			{"register NUL in name", "PUT", jobs, `{"category":"modifiers","name":"a\u0000b"}`, 422, v},
			{"register NUL in category", "PUT", jobs, `{"category":"modi\u0000fiers","name":"X"}`, 422, v},
			{"register name too long", "PUT", jobs, map[string]any{"category": "modifiers", "name": noise(1025)}, 422, v},
			{"register category too long", "PUT", jobs, map[string]any{"category": noise(257), "name": "X"}, 422, v},
			{"register room invalid UTF-8", "PUT", api + "/rooms/a%ffb/jobs", map[string]any{"category": "modifiers", "name": "X"}, 400, "invalid-room-id"},
			{"register room with NUL", "PUT", api + "/rooms/a%00b/jobs", map[string]any{"category": "modifiers", "name": "X"}, 400, "invalid-room-id"},
			{"register foreign worker", "PUT", jobs, map[string]any{"category": "modifiers", "name": "X", "worker_id": "00000000-0000-0000-0000-000000000001"}, 404, "worker-not-found"},

			// POST /rooms/{room}/tasks/{job}
			{"submit no body", "POST", submit, "", 422, v},
			{"submit malformed JSON", "POST", submit, `{"payload": {`, 422, v},
			{"submit array", "POST", submit, `[{"payload":{}}]`, 422, v},
			{"submit null payload", "POST", submit, map[string]any{"payload": nil}, 422, v},
			{"submit array payload", "POST", submit, map[string]any{"payload": []any{1}}, 422, v},
			{"submit string payload", "POST", submit, map[string]any{"payload": "x"}, 422, v},
			{"submit numeric payload", "POST", submit, map[string]any{"payload": 5}, 422, v},
			{"submit unknown job", "POST", api + "/rooms/room/tasks/@global:modifiers:Nope", map[string]any{}, 404, "job-not-found"},
			{"submit job name with NUL", "POST", api + "/rooms/room/tasks/@global:modifiers:a%00b", map[string]any{}, 404, "job-not-found"},
			{"submit job name invalid UTF-8", "POST", api + "/rooms/room/tasks/@global:modifiers:a%ffb", map[string]any{}, 404, "job-not-found"},
			{"submit job name too long", "POST", api + "/rooms/room/tasks/room:modifiers:" + noise(3000), map[string]any{}, 404, "job-not-found"},
			{"submit room invalid UTF-8", "POST", api + "/rooms/a%ffb/tasks/" + rotate, map[string]any{}, 400, "invalid-room-id"},
			{"submit bad room", "POST", api + "/rooms/a@b/tasks/" + rotate, map[string]any{}, 400, "invalid-room-id"},

			// POST /tasks/claim
			{"claim no body", "POST", claim, "", 422, v},
			{"claim empty object", "POST", claim, map[string]any{}, 422, v},
			{"claim null worker", "POST", claim, map[string]any{"worker_id": nil}, 422, v},
			{"claim non-UUID worker", "POST", claim, map[string]any{"worker_id": "nope"}, 422, v},
			{"claim numeric worker", "POST", claim, map[string]any{"worker_id": 5}, 422, v},
			{"claim key in other case", "POST", claim, map[string]any{"Worker_ID": w}, 422, v},
			{"claim array", "POST", claim, `["` + w + `"]`, 422, v},
			{"claim malformed JSON", "POST", claim, `{"worker_id": "` + w, 422, v},

			// PATCH /tasks/{id}
			{"update non-UUID", "PATCH", api + "/tasks/not-a-uuid", map[string]any{"status": "running"}, 422, v},
			{"update no body", "PATCH", task, "", 422, v},
			{"update empty object", "PATCH", task, map[string]any{}, 422, v},
			{"update bad status", "PATCH", task, map[string]any{"status": "bogus"}, 422, v},
			{"update status by name", "PATCH", task, map[string]any{"status": "RUNNING"}, 422, v},
			{"update numeric status", "PATCH", task, map[string]any{"status": 1}, 422, v},
			{"update null status", "PATCH", task, map[string]any{"status": nil}, 422, v},
			{"update key in other case", "PATCH", task, map[string]any{"STATUS": "running"}, 422, v},
			{"update exact key wins over other case", "PATCH", task, `{"status":"completed","Status":"running"}`, 409, "invalid-task-transition"},
			{"update numeric error", "PATCH", task, map[string]any{"status": "running", "error": 5}, 422, v},
			{"update malformed JSON", "PATCH", task, `{"status": running}`, 422, v},
			{"update NUL in error", "PATCH", task, `{"status":"running","error":"a\u0000"}`, 422, v},
			{"update invalid transition", "PATCH", task, map[string]any{"status": "completed"}, 409, "invalid-task-transition"},

			// GET /tasks/{id} and the listings
			{"get non-UUID", "GET", api + "/tasks/not-a-uuid", nil, 422, v},
			{"get unknown", "GET", api + "/tasks/00000000-0000-0000-0000-000000000000", nil, 404, "task-not-found"},
			{"job details NUL", "GET", api + "/rooms/room/jobs/@global:modifiers:a%00b", nil, 404, "job-not-found"},
			{"job tasks invalid UTF-8", "GET", api + "/rooms/room/jobs/@global:modifiers:a%ffb/tasks", nil, 404, "job-not-found"},
			{"job details too long", "GET", api + "/rooms/room/jobs/room:" + noise(300) + ":X", nil, 404, "job-not-found"},
			{"jobs of invalid UTF-8 room", "GET", api + "/rooms/a%ffb/jobs", nil, 400, "invalid-room-id"},
			{"tasks of invalid UTF-8 room", "GET", api + "/rooms/a%ffb/tasks", nil, 400, "invalid-room-id"},
			{"workers of invalid UTF-8 room", "GET", api + "/rooms/a%ffb/workers", nil, 400, "invalid-room-id"},
			{"workers negative limit", "GET", api + "/workers?limit=-1", nil, 422, v},
			{"workers limit too big", "GET", api + "/workers?limit=501", nil, 422, v},
			{"jobs non-numeric limit", "GET", api + "/rooms/room/jobs?limit=ten", nil, 422, v},
			{"jobs negative offset", "GET", api + "/rooms/room/jobs?offset=-1", nil, 422, v},
			{"room workers float offset", "GET", api + "/rooms/room/workers?offset=0.5", nil, 422, v},
			{"room tasks bad status", "GET", api + "/rooms/room/tasks?status=bogus", nil, 422, v},
			{"room tasks bad limit", "GET", api + "/rooms/room/tasks?limit=x", nil, 422, v},
			{"job tasks bad status", "GET", api + "/rooms/room/jobs/" + rotate + "/tasks?status=PENDING", nil, 422, v},
			{"job tasks bad offset", "GET", api + "/rooms/room/jobs/" + rotate + "/tasks?offset=-5", nil, 422, v},
		}
		for _, c := range cases {
			r := e.do(e.admin, c.method, c.path, c.body)
			if r.Status == 500 {
				t.Fatalf("%s: 500 %s", c.name, r.Body)
			}
			if r.Status != c.status || r.Header.Get("Content-Type") != "application/problem+json" {
				t.Errorf("%s: %d %s %s, want %d problem+json", c.name, r.Status, r.Header.Get("Content-Type"), r.Body, c.status)
				continue
			}
			p := r.M()
			wantKeys(t, c.name, p, "type", "title", "status", "detail")
			if p["type"] != "/v1/problems/"+c.slug || p["status"] != float64(c.status) || p["title"] == "" || p["detail"] == "" {
				t.Errorf("%s: problem %v, want type %s", c.name, p, c.slug)
			}
			if ems := e.emissions(); len(ems) != 0 {
				t.Errorf("%s: emitted %v", c.name, ems)
			}
		}
		if after := e.state(claimedID, pendingID); !after.equal(before) {
			t.Fatalf("bad input changed state:\nbefore %+v\nafter  %+v", before, after)
		}
	})
}
