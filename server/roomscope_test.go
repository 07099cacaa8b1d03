package server_test

import (
	"strings"
	"testing"
	"time"

	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
)

// ownRoomsEnv is an API whose room host gives alice only room "alice" and bob
// only room "bob" (the admin every room), with bob's job
// bob:modifiers:Secret and bob's provider bob:frames:data registered in room
// bob by bob's worker.
func ownRoomsEnv(t *testing.T, db *models.DB) (*env, *roomHost, string) {
	host := newRoomHost(t)
	ra := server.DefaultRoomAuthConfig()
	ra.URL = host.srv.URL
	e := roomAuthEnv(t, db, ra)
	host.mu.Lock()
	host.admin = e.admin
	host.own = map[string]string{e.alice: "alice", e.bob: "bob"}
	host.mu.Unlock()
	w := e.newWorker(e.bob)
	e.registerJob(e.bob, "bob", "modifiers", "Secret", map[string]any{"worker_id": w})
	e.registerProvider(e.bob, "bob", "frames", "data", map[string]any{"worker_id": w}).want(201)
	return e, host, w
}

// Finding 1: under room delegation a provider is read (its info, a cached
// result, a read that dispatches to its worker) only with read access to the
// provider's own room, whichever room the URL names, @global included.
func TestRoomDelegationProviderOwnRoom(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		e, host, _ := ownRoomsEnv(t, db)
		const prov = "bob:frames:data"
		id := e.do(e.bob, "GET", api+"/rooms/bob/providers/"+prov+"/info", nil).want(200).M()["id"].(string)
		e.upload(e.bob, id, joblib.RequestHash(map[string]string{"frame": "1"}), []byte("bob's frame")).want(204)
		reqs := countRequests(t, e.bus, prov)

		for _, room := range []string{"bob", "@global", "alice"} {
			m := e.do(e.alice, "GET", api+"/rooms/"+room+"/providers/"+prov+"/info", nil).problem(403, "forbidden")
			if m["detail"] != "No read access to room 'bob'" {
				t.Fatalf("info through %s: %v", room, m["detail"])
			}
			r := e.readProvider(e.alice, room, prov, map[string]string{"frame": "1"})
			if r.Status != 403 || strings.Contains(string(r.Body), "bob's frame") {
				t.Fatalf("cached read through %s: %d %s", room, r.Status, r.Body)
			}
			e.readProvider(e.alice, room, prov, map[string]string{"frame": "2"}, "Prefer: wait=0").problem(403, "forbidden")
		}
		if n := reqs.n.Load(); n != 0 {
			t.Fatalf("alice's reads dispatched %d provider_request(s) to bob's worker", n)
		}
		if host.countBy(e.alice, "bob", "read") == 0 {
			t.Fatalf("the host was never asked about room bob: %+v", host.questions())
		}

		// bob reads his own provider through any room he may use, @global too.
		for _, room := range []string{"bob", "@global"} {
			e.do(e.bob, "GET", api+"/rooms/"+room+"/providers/"+prov+"/info", nil).want(200)
			if r := e.readProvider(e.bob, room, prov, map[string]string{"frame": "1"}).want(200); string(r.Body) != "bob's frame" {
				t.Fatalf("bob's read through %s: %s", room, r.Body)
			}
		}
		// @global providers stay readable from every room, without asking.
		e.provider(e.admin, "@global", "frames", "shared")
		e.do(e.alice, "GET", api+"/rooms/alice/providers/@global:frames:shared/info", nil).want(200)
		e.do(e.alice, "GET", api+"/rooms/@global/providers/@global:frames:shared/info", nil).want(200)
		for _, q := range host.questions() {
			if strings.HasPrefix(q.RoomID, "@") {
				t.Fatalf("asked the host about %s", q.RoomID)
			}
		}
	})
}

// Finding 2: under room delegation a job is read (its details, its tasks)
// with read access to the job's own room and submitted to with write access
// to it; the room in the URL is checked as well. Sockets join a job's room
// on the same rule.
func TestRoomDelegationJobOwnRoom(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		e, host, bobWorker := ownRoomsEnv(t, db)
		const job = "bob:modifiers:Secret"
		for _, room := range []string{"alice", "@global"} {
			e.do(e.alice, "GET", api+"/rooms/"+room+"/jobs/"+job, nil).problem(403, "forbidden")
			e.do(e.alice, "GET", api+"/rooms/"+room+"/jobs/"+job+"/tasks", nil).problem(403, "forbidden")
			m := e.do(e.alice, "POST", api+"/rooms/"+room+"/tasks/"+job, map[string]any{"payload": map[string]any{"secret": "alice's"}}).problem(403, "forbidden")
			if m["detail"] != "No write access to room 'bob'" {
				t.Fatalf("submit through %s: %v", room, m["detail"])
			}
		}
		// The name is judged as the domain resolves it: escaped or not.
		e.do(e.alice, "GET", api+"/rooms/alice/jobs/bob%3Amodifiers%3ASecret", nil).problem(403, "forbidden")
		e.do(e.alice, "GET", api+"/rooms/@global/providers/%62ob:frames:data/info", nil).problem(403, "forbidden")
		if host.countBy(e.alice, "bob", "write") == 0 || host.countBy(e.alice, "bob", "read") == 0 {
			t.Fatalf("the host was not asked about the job's room: %+v", host.questions())
		}
		if task := e.claim(e.bob, bobWorker); task != nil {
			t.Fatalf("bob's worker claimed %v", task)
		}
		for _, room := range []string{"alice", "@global", "bob"} {
			if n := e.total(api + "/rooms/" + room + "/tasks"); n != 0 {
				t.Fatalf("%d tasks in room %s", n, room)
			}
		}

		// bob uses his job; alice cannot read the task he submitted.
		e.do(e.bob, "GET", api+"/rooms/bob/jobs/"+job, nil).want(200)
		task := e.submit(e.bob, "bob", job, map[string]any{"x": 1})
		if got := e.claim(e.bob, bobWorker); got == nil || got["id"] != task {
			t.Fatalf("bob's worker claimed %v, want %s", got, task)
		}
		e.do(e.alice, "GET", api+"/tasks/"+task, nil).problem(403, "forbidden")
		e.do(e.alice, "GET", api+"/rooms/bob/tasks", nil).problem(403, "forbidden")

		// @global jobs stay usable from every room, without asking.
		e.seed()
		e.do(e.alice, "GET", api+"/rooms/alice/jobs/"+rotate, nil).want(200)
		e.submit(e.alice, "alice", rotate, nil)
		for _, q := range host.questions() {
			if strings.HasPrefix(q.RoomID, "@") {
				t.Fatalf("asked the host about %s", q.RoomID)
			}
		}

		// A socket joins a job's room only with access to the job's room.
		aliceWorker := e.newWorker(e.alice)
		c := mustDialSIO(t, e.url, e.alice)
		if a := c.call("join_job_room", map[string]any{"job_name": job, "worker_id": aliceWorker}); a["ok"] != false || a["status"] != float64(403) {
			t.Fatalf("join_job_room of bob's job as alice: %v", a)
		}
		if a := c.call("join_provider_room", map[string]any{"provider_name": "bob:frames:data", "worker_id": aliceWorker}); a["ok"] != false || a["status"] != float64(403) {
			t.Fatalf("join_provider_room of bob's provider as alice: %v", a)
		}
		c.mustCall("join_job_room", map[string]any{"job_name": rotate, "worker_id": aliceWorker})
	})
}

// Without room delegation the contract's rule stays: any room may address
// any job, and a read through @global reaches any room's provider.
func TestNoRoomDelegationAnyRoomAddressesAnyJob(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w := e.newWorker(e.bob)
		e.registerJob(e.bob, "bob", "modifiers", "Secret", map[string]any{"worker_id": w})
		e.provider(e.bob, "bob", "frames", "data", map[string]any{"worker_id": w})
		e.do(e.alice, "GET", api+"/rooms/alice/jobs/bob:modifiers:Secret", nil).want(200)
		task := e.submit(e.alice, "alice", "bob:modifiers:Secret", nil)
		if got := e.claim(e.bob, w); got == nil || got["id"] != task {
			t.Fatalf("bob's worker claimed %v, want %s", got, task)
		}
		e.do(e.alice, "GET", api+"/rooms/@global/providers/bob:frames:data/info", nil).want(200)
	})
}

// Waiting for the host is bounded like any other call: a submission through
// @global to a job in a room the host does not answer for fails closed.
func TestRoomDelegationObjectRoomHostSlow(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		host := newRoomHost(t)
		ra := server.DefaultRoomAuthConfig()
		ra.URL = host.srv.URL
		ra.Timeout = 200 * time.Millisecond
		e := roomAuthEnv(t, db, ra)
		e.do(e.alice, "POST", api+"/rooms/@global/tasks/slow:modifiers:J", map[string]any{"payload": map[string]any{}}).problem(503, "room-auth-unavailable")
		e.do(e.alice, "GET", api+"/rooms/open/providers/slow:frames:x/info", nil).problem(503, "room-auth-unavailable")
	})
}
