package server_test

import (
	"net/http"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/joblib"
)

// test_router_jobs.py: a superuser registers a @global job: 201 with the full
// name, one linked (auto-created) worker, and that worker's id.
func TestRegisterJobGlobal(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		j := e.do(e.admin, "PUT", api+"/rooms/@global/jobs", map[string]any{
			"category": "modifiers", "name": "Rotate", "schema": map[string]any{"type": "object"},
		}).want(201).M()
		wantHasKeys(t, "job", j, "id", "room_id", "category", "name", "full_name", "schema", "workers", "worker_id")
		if j["full_name"] != rotate || j["room_id"] != "@global" || j["category"] != "modifiers" || j["name"] != "Rotate" {
			t.Fatalf("job %v", j)
		}
		ws := j["workers"].([]any)
		if len(ws) != 1 || ws[0] != j["worker_id"] {
			t.Fatalf("workers %v, worker_id %v", ws, j["worker_id"])
		}
		if _, err := uuid.Parse(j["worker_id"].(string)); err != nil {
			t.Fatalf("worker_id %v", j["worker_id"])
		}
		if j["schema"].(map[string]any)["type"] != "object" {
			t.Fatalf("schema %v", j["schema"])
		}
		// The auto-created worker exists and is listed.
		if p := e.do(e.admin, "GET", api+"/workers", nil).want(200).page(); p.Total != 1 || p.Items[0]["id"] != j["worker_id"] {
			t.Fatalf("workers %v", p.Items)
		}
	})
}

// test_router_jobs.py: room jobs are registered by any user under the room's
// full name; @global and @internal need a superuser (403, nothing created).
func TestRegisterJobRoomsAndPermissions(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		j := e.do(e.alice, "PUT", api+"/rooms/room_123/jobs", map[string]any{"category": "selections", "name": "All"}).want(201).M()
		if j["full_name"] != "room_123:selections:All" {
			t.Fatalf("full_name %v", j["full_name"])
		}
		for _, room := range []string{"@global", "@internal"} {
			p := e.do(e.alice, "PUT", api+"/rooms/"+room+"/jobs", map[string]any{"category": "modifiers", "name": "X"}).problem(403, "forbidden")
			if p["detail"] != "Admin required for @global/@internal job registration" {
				t.Fatalf("detail %v", p["detail"])
			}
		}
		if n := e.total(api + "/workers"); n != 1 {
			t.Fatalf("forbidden registrations created workers: %d", n)
		}
		if n := e.total(api + "/rooms/@global/jobs"); n != 0 {
			t.Fatalf("forbidden registration created a job")
		}
	})
}

// test_router_jobs.py: a category outside the allow-list is 400
// invalid-category and creates nothing.
func TestRegisterJobInvalidCategory(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		p := e.do(e.admin, "PUT", api+"/rooms/@global/jobs", map[string]any{"category": "bogus", "name": "X"}).problem(400, "invalid-category")
		if p["detail"] != "Category 'bogus' not in allowed list: ['modifiers', 'selections', 'analysis']" || p["title"] != "Bad Request" {
			t.Fatalf("problem %v", p)
		}
		if e.total(api+"/workers") != 0 || e.total(api+"/rooms/@global/jobs") != 0 {
			t.Fatal("rejected registration left rows behind")
		}
	})
}

// test_router_jobs.py: re-registering an active job with another schema is
// 409 schema-conflict; the same schema is the idempotent 200 (with a newly
// auto-created worker); Python number semantics (1 == 1.0 == true) apply.
func TestRegisterJobSchemaRules(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		reg := func(schema any) resp {
			return e.do(e.admin, "PUT", api+"/rooms/@global/jobs", map[string]any{"category": "modifiers", "name": "Rotate", "schema": schema})
		}
		first := reg(map[string]any{"a": 1, "b": []any{"x"}}).want(201).M()
		p := reg(map[string]any{"a": 2}).problem(409, "schema-conflict")
		if p["detail"] != "Schema mismatch for job '"+rotate+"'" || p["title"] != "Conflict" {
			t.Fatalf("problem %v", p)
		}
		again := reg(map[string]any{"b": []any{"x"}, "a": 1.0}).want(200).M()
		if again["worker_id"] == nil || again["worker_id"] == first["worker_id"] || again["id"] != first["id"] {
			t.Fatalf("idempotent registration %v (first %v)", again, first)
		}
		reg(map[string]any{"a": true, "b": []any{"x"}}).want(200)
		if n := len(e.do(e.admin, "GET", api+"/rooms/@global/jobs/"+rotate, nil).want(200).M()["workers"].([]any)); n != 3 {
			t.Fatalf("%d workers, want 3 (one per registration without worker_id)", n)
		}
		// Different rooms may use different schemas for the same category:name.
		e.do(e.alice, "PUT", api+"/rooms/room_1/jobs", map[string]any{"category": "modifiers", "name": "Rotate", "schema": map[string]any{"z": 1}}).want(201)
	})
}

// test_router_jobs.py: GET of a job lists its workers (no worker_count) and
// worker_id null; two users registering the same job both show up.
func TestJobWorkerIDs(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w1 := e.registerJob(e.alice, "room_1", "analysis", "RDF")["worker_id"]
		j := e.do(e.bob, "GET", api+"/rooms/room_1/jobs/room_1:analysis:RDF", nil).want(200).M()
		if ws := j["workers"].([]any); len(ws) != 1 || ws[0] != w1 {
			t.Fatalf("workers %v, want [%v]", ws, w1)
		}
		if _, ok := j["worker_count"]; ok {
			t.Fatalf("unexpected worker_count in %v", j)
		}
		if v, ok := j["worker_id"]; !ok || v != nil {
			t.Fatalf("worker_id %v, want null", v)
		}
		w2 := e.registerJob(e.bob, "room_1", "analysis", "RDF")["worker_id"]
		items := e.do(e.alice, "GET", api+"/rooms/room_1/jobs", nil).want(200).page().Items
		if len(items) != 1 {
			t.Fatalf("jobs %v", items)
		}
		wantKeys(t, "job summary", items[0], "full_name", "category", "name", "workers")
		ws := map[any]bool{}
		for _, w := range items[0]["workers"].([]any) {
			ws[w] = true
		}
		if len(ws) != 2 || !ws[w1] || !ws[w2] {
			t.Fatalf("summary workers %v, want %v and %v", items[0]["workers"], w1, w2)
		}
	})
}

// test_router_jobs.py: a job soft-deleted as an orphan is reactivated by a
// registration with a different schema: 201 and the new schema.
func TestReregisterSoftDeletedJob(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		j := e.registerJob(e.admin, "@global", "modifiers", "Rotate")
		e.do(e.admin, "DELETE", api+"/workers/"+j["worker_id"].(string), nil).want(204)
		e.do(e.admin, "GET", api+"/rooms/@global/jobs/"+rotate, nil).problem(404, "job-not-found")
		if n := e.total(api + "/rooms/@global/jobs"); n != 0 {
			t.Fatalf("soft-deleted job still listed")
		}
		again := e.do(e.admin, "PUT", api+"/rooms/@global/jobs", map[string]any{
			"category": "modifiers", "name": "Rotate", "schema": map[string]any{"new": true},
		}).want(201).M()
		if again["id"] != j["id"] {
			t.Fatalf("reactivation made a new row: %v vs %v", again["id"], j["id"])
		}
		got := e.do(e.admin, "GET", api+"/rooms/@global/jobs/"+rotate, nil).want(200).M()
		if got["schema"].(map[string]any)["new"] != true {
			t.Fatalf("schema %v", got["schema"])
		}
	})
}

// test_router_jobs.py / test_multi_worker.py: an explicit worker_id is reused
// (the second registration with it is 200); someone else's or an unknown
// worker is 404 worker-not-found (superusers included) and nothing is created.
func TestRegisterJobWithExistingWorker(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w := e.newWorker(e.admin)
		j := e.registerJob(e.admin, "@global", "modifiers", "Rotate", map[string]any{"worker_id": w})
		if ws := j["workers"].([]any); len(ws) != 1 || ws[0] != w || j["worker_id"] != w {
			t.Fatalf("job %v, want workers [%s]", j, w)
		}
		// test_multi_worker.py: the same user's second worker joins with 200.
		w2 := e.newWorker(e.admin)
		again := e.do(e.admin, "PUT", api+"/rooms/@global/jobs", map[string]any{"category": "modifiers", "name": "Rotate", "worker_id": w2}).want(200).M()
		if len(again["workers"].([]any)) != 2 {
			t.Fatalf("workers %v", again["workers"])
		}

		alices := e.newWorker(e.alice)
		for _, id := range []string{alices, uuid.NewString()} {
			p := e.do(e.admin, "PUT", api+"/rooms/@global/jobs", map[string]any{"category": "modifiers", "name": "Other", "worker_id": id}).problem(404, "worker-not-found")
			if p["detail"] != "Worker '"+id+"' not found or not owned by user" {
				t.Fatalf("detail %v", p["detail"])
			}
		}
		if n := e.total(api + "/rooms/@global/jobs"); n != 1 {
			t.Fatalf("failed registrations created jobs: %d", n)
		}
		if n := e.total(api + "/workers"); n != 3 {
			t.Fatalf("failed registrations created workers: %d", n)
		}
	})
}

// test_router_job_list.py: @global lists only @global jobs; a room lists its
// own, @global's and @internal's; job details and 404s.
func TestJobListVisibility(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		e.registerJob(e.admin, "@global", "modifiers", "Rotate")
		e.registerJob(e.admin, "@global", "selections", "All")
		e.registerJob(e.alice, "room_123", "analysis", "RDF")
		e.registerJob(e.alice, "room_456", "analysis", "Other")

		names := func(room string) map[any]bool {
			p := e.do(e.alice, "GET", api+"/rooms/"+room+"/jobs", nil).want(200).page()
			m := map[any]bool{}
			for _, n := range p.field("full_name") {
				m[n] = true
			}
			if p.Total != len(p.Items) {
				t.Fatalf("%s: total %d for %d items", room, p.Total, len(p.Items))
			}
			return m
		}
		if g := names("@global"); len(g) != 2 || !g[rotate] || !g["@global:selections:All"] {
			t.Fatalf("@global lists %v", g)
		}
		if r := names("room_123"); len(r) != 3 || !r["room_123:analysis:RDF"] || r["room_456:analysis:Other"] {
			t.Fatalf("room_123 lists %v", r)
		}

		// test_router_jobs.py: an @internal job is visible from a regular
		// room, and only it from @internal.
		e.registerJob(e.admin, "@internal", "modifiers", "Center")
		if r := names("room_123"); len(r) != 4 || !r["@internal:modifiers:Center"] {
			t.Fatalf("room_123 lists %v", r)
		}
		if i := names("@internal"); len(i) != 1 || !i["@internal:modifiers:Center"] {
			t.Fatalf("@internal lists %v", i)
		}
		if g := names("@global"); g["@internal:modifiers:Center"] {
			t.Fatalf("@global lists the internal job")
		}

		j := e.do(e.alice, "GET", api+"/rooms/room_123/jobs/"+rotate, nil).want(200).M()
		if j["full_name"] != rotate || j["category"] != "modifiers" {
			t.Fatalf("details %v", j)
		}
		// No visibility check on resolution: room_456 can read room_123's job.
		e.do(e.alice, "GET", api+"/rooms/room_456/jobs/room_123:analysis:RDF", nil).want(200)

		p := e.do(e.alice, "GET", api+"/rooms/room_123/jobs/@global:modifiers:Nope", nil).problem(404, "job-not-found")
		if p["detail"] != "Job '@global:modifiers:Nope' not found" {
			t.Fatalf("detail %v", p["detail"])
		}
		p = e.do(e.alice, "GET", api+"/rooms/room_123/jobs/only:two", nil).problem(404, "job-not-found")
		if p["detail"] != "Invalid job name format: only:two" {
			t.Fatalf("detail %v", p["detail"])
		}
	})
}

// test_router_jobs.py, test_writable_room.py: invalid room ids are 400
// invalid-room-id on register and submit, checked before authentication;
// reads of the (valid) room are unaffected.
func TestInvalidRoomIDs(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		e.seed()
		for _, room := range []string{"bad@room", "bad:room", "room@123", "room:123"} {
			for _, tok := range []string{"", e.alice} {
				p := e.do(tok, "PUT", api+"/rooms/"+room+"/jobs", map[string]any{"category": "modifiers", "name": "X"}).problem(400, "invalid-room-id")
				if p["detail"] != "Room ID '"+room+"' contains invalid characters (@ or :)" {
					t.Fatalf("register detail %v", p["detail"])
				}
				p = e.do(tok, "POST", api+"/rooms/"+room+"/tasks/"+rotate, map[string]any{"payload": map[string]any{}}).problem(400, "invalid-room-id")
				if p["detail"] != "Room ID '"+room+"' contains invalid characters (@ or :)" {
					t.Fatalf("submit detail %v", p["detail"])
				}
			}
			// Reads of an invalid room are 400 too.
			for _, path := range []string{"/jobs", "/tasks", "/workers", "/jobs/" + rotate, "/jobs/" + rotate + "/tasks"} {
				e.do(e.alice, "GET", api+"/rooms/"+room+path, nil).problem(400, "invalid-room-id")
			}
		}
		if e.total(api+"/rooms/room/tasks") != 0 || e.total(api+"/workers") != 1 || e.total(api+"/rooms/room/jobs") != 1 {
			t.Fatal("rejected writes changed state")
		}
		// Writes to and reads of valid rooms work.
		e.do(e.alice, "PUT", api+"/rooms/b/jobs", map[string]any{"category": "modifiers", "name": "X"}).want(201)
		e.do(e.alice, "POST", api+"/rooms/b/tasks/"+rotate, map[string]any{"payload": map[string]any{}}).want(202)
		e.do(e.alice, "GET", api+"/rooms/b/jobs", nil).want(200)
		e.do(e.alice, "GET", api+"/rooms/b/tasks", nil).want(200)
	})
}

// DESIGN improvement 4: concurrent first registrations of the same job never
// answer 500: all succeed, exactly one creates (201), one job row results,
// and every registration's worker is linked.
func TestConcurrentFirstRegistration(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		const n = 20
		codes := make([]int, n)
		workers := make([]string, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				body := `{"category":"modifiers","name":"Race","schema":{"k":1}}`
				req, _ := http.NewRequest("PUT", e.url+api+"/rooms/race/jobs", stringsReader(body))
				req.Header.Set("Authorization", "Bearer "+e.alice)
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				defer res.Body.Close()
				codes[i] = res.StatusCode
				var j struct {
					WorkerID string `json:"worker_id"`
				}
				_ = decodeJSON(res.Body, &j)
				workers[i] = j.WorkerID
			})
		}
		close(start)
		wg.Wait()
		created := 0
		for i, c := range codes {
			switch c {
			case 201:
				created++
			case 200:
			default:
				t.Fatalf("registration %d answered %d", i, c)
			}
		}
		if created != 1 {
			t.Fatalf("%d registrations answered 201, want exactly 1 (codes %v)", created, codes)
		}
		p := e.do(e.alice, "GET", api+"/rooms/race/jobs", nil).want(200).page()
		if p.Total != 1 {
			t.Fatalf("%d job rows, want 1", p.Total)
		}
		linked := map[any]bool{}
		for _, w := range p.Items[0]["workers"].([]any) {
			linked[w] = true
		}
		for _, w := range workers {
			if !linked[w] {
				t.Fatalf("worker %s of a successful registration is not linked (linked: %v)", w, p.Items[0]["workers"])
			}
		}
		if len(linked) != n {
			t.Fatalf("%d linked workers, want %d", len(linked), n)
		}
	})
}

// The longest accepted names (room 256, category 256, name 1024 bytes of
// incompressible text) register, resolve and take tasks on both databases.
func TestRegisterJobLongestNames(t *testing.T) {
	t.Parallel()
	settings := withSettings(func(s *joblib.Settings) { s.AllowedCategories = append(s.AllowedCategories, noise(256)) })
	eachWith(t, []func(*setupOpts){settings}, func(t *testing.T, e *env) {
		room, cat, name := noise(256), noise(256), noise(1024)
		e.do(e.alice, "PUT", api+"/rooms/"+room+"/jobs", map[string]any{"category": cat, "name": name}).want(201)
		full := room + ":" + cat + ":" + name
		e.do(e.alice, "GET", api+"/rooms/"+room+"/jobs/"+full, nil).want(200)
		e.do(e.alice, "POST", api+"/rooms/"+room+"/tasks/"+full, map[string]any{}).want(202)
	})
}

// Request bodies accept schema_ as an alias of schema, and unknown fields are
// ignored on every body.
func TestRequestBodyAliasesAndUnknownFields(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		j := e.do(e.alice, "PUT", api+"/rooms/room/jobs", map[string]any{
			"category": "modifiers", "name": "Aliased", "schema_": map[string]any{"title": "via alias"}, "unknown": []any{1},
		}).want(201).M()
		if j["schema"].(map[string]any)["title"] != "via alias" {
			t.Fatalf("schema %v", j["schema"])
		}
		w := j["worker_id"].(string)
		id := e.do(e.bob, "POST", api+"/rooms/room/tasks/room:modifiers:Aliased", map[string]any{"payload": map[string]any{}, "priority": 9}).want(202).M()["id"].(string)
		c := e.do(e.alice, "POST", api+"/tasks/claim", map[string]any{"worker_id": w, "extra": true}).want(200).M()["task"].(map[string]any)
		if c["id"] != id {
			t.Fatalf("claimed %v", c)
		}
		e.do(e.alice, "PATCH", api+"/tasks/"+id, map[string]any{"status": "running", "progress": 0.5}).want(200)

		// worker_id null means absent: a new worker is created.
		again := e.do(e.alice, "PUT", api+"/rooms/room/jobs", map[string]any{
			"category": "modifiers", "name": "Aliased", "schema": map[string]any{"title": "via alias"}, "worker_id": nil,
		}).want(200).M()
		if again["worker_id"] == nil || again["worker_id"] == w {
			t.Fatalf("worker_id null: %v", again)
		}
	})
}

// Job names may contain '/' and ':' (the full name splits on the first two
// colons); the /tasks suffix addresses the job's task listing.
func TestJobNamesWithSlashAndColon(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		for _, name := range []string{"a/b", "x:y", "deep/er/name:v2"} {
			full := "room:modifiers:" + name
			j := e.registerJob(e.alice, "room", "modifiers", name)
			if j["full_name"] != full || j["name"] != name {
				t.Fatalf("registered %v", j)
			}
			if got := e.do(e.alice, "GET", api+"/rooms/room/jobs/"+full, nil).want(200).M(); got["name"] != name {
				t.Fatalf("GET %s: %v", full, got)
			}
			id := e.submit(e.bob, "room", full, map[string]any{"n": name})
			if got := e.getTask(id); got["job_name"] != full {
				t.Fatalf("task job_name %v, want %s", got["job_name"], full)
			}
			p := e.do(e.alice, "GET", api+"/rooms/room/jobs/"+full+"/tasks", nil).want(200).page()
			if p.Total != 1 || p.Items[0]["id"] != id {
				t.Fatalf("tasks of %s: %+v", full, p)
			}
		}
	})
}

// A worker summary's job_count counts all of the worker's links, also those
// to jobs the listed room does not see.
func TestWorkerJobCountCountsAllLinks(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w := e.newWorker(e.alice)
		for _, room := range []string{"room1", "room2", "room3"} {
			e.registerJob(e.alice, room, "modifiers", "Job", map[string]any{"worker_id": w})
		}
		p := e.do(e.alice, "GET", api+"/rooms/room1/workers", nil).want(200).page()
		if p.Total != 1 || p.Items[0]["id"] != w || p.Items[0]["job_count"] != 3.0 {
			t.Fatalf("room1 workers %+v", p)
		}
		hb := e.do(e.alice, "PATCH", api+"/workers/"+w, nil).want(200).M()
		wantKeys(t, "heartbeat", hb, "id", "last_heartbeat")
		wantTime(t, "last_heartbeat", hb["last_heartbeat"])
	})
}
