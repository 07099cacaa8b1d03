package server_test

import (
	"slices"
	"testing"
	"time"

	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
)

func realtimeCfg() server.RealtimeConfig {
	c := server.DefaultRealtimeConfig()
	c.PingInterval = 300 * time.Millisecond
	// Pings stay frequent, so every test exercises them, but a client may
	// answer late: under -race on a loaded 2-core machine a client's reader
	// can be starved for over a second, and a 300 ms timeout then closed
	// healthy sockets mid-test (TestBatchUpdateRace's "socket closed",
	// TestNodeClientFlow's lost jobs_invalidate). No test here relies on the
	// ping timeout to find a dead client: a killed process closes its TCP
	// connection at once.
	c.PingTimeout = 3 * time.Second
	c.DisconnectGrace = 500 * time.Millisecond
	c.KeepAliveInterval = 100 * time.Millisecond
	return c
}

func eachRealtime(t *testing.T, fn func(t *testing.T, e *env)) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		fn(t, setup(t, db, withRealtime(realtimeCfg())))
	})
}

func TestSocketConnectRequiresToken(t *testing.T) {
	t.Parallel()
	eachRealtime(t, func(t *testing.T, e *env) {
		if _, err := dialSIO(t, e.url, ""); err == nil || err.Error() != "Unauthorized" {
			t.Fatalf("no token: %v, want CONNECT_ERROR Unauthorized", err)
		}
		if _, err := dialSIO(t, e.url, "jl_nope"); err == nil || err.Error() != "Unauthorized" {
			t.Fatalf("bad token: %v, want CONNECT_ERROR Unauthorized", err)
		}
		mustDialSIO(t, e.url, e.alice)
	})
}

// TestSocketJoinAuthorization: joins are authorized and answered with an ack;
// refusals change nothing.
func TestSocketJoinAuthorization(t *testing.T) {
	t.Parallel()
	eachRealtime(t, func(t *testing.T, e *env) {
		job := e.registerJob(e.alice, "r1", "modifiers", "Rot")
		wid := job["worker_id"].(string)
		bobWorker := e.do(e.bob, "POST", api+"/workers", nil).want(201).M()["id"].(string)
		c := mustDialSIO(t, e.url, e.alice)

		cases := []struct {
			event  string
			arg    map[string]any
			status float64
		}{
			{"join_job_room", map[string]any{"job_name": "r1:modifiers:Rot", "worker_id": bobWorker}, 404},
			{"join_job_room", map[string]any{"job_name": "r1:modifiers:Nope", "worker_id": wid}, 404},
			{"join_job_room", map[string]any{"job_name": "r1:modifiers:Rot", "worker_id": "not-a-uuid"}, 422},
			{"join_job_room", map[string]any{"job_name": "r1:modifiers:Rot"}, 422},
			{"join_provider_room", map[string]any{"provider_name": "r1:files:none", "worker_id": wid}, 404},
			{"join_room", map[string]any{"room_id": "bad@room"}, 400},
			{"frobnicate", map[string]any{}, 404},
		}
		for _, tc := range cases {
			a := c.call(tc.event, tc.arg)
			if a["ok"] != false || a["status"] != tc.status {
				t.Errorf("%s %v: ack %v, want status %v", tc.event, tc.arg, a, tc.status)
			}
		}
		if e.rt.IO().RoomSize("jobs:r1:modifiers:Rot") != 0 {
			t.Fatal("a refused join joined the room")
		}
		c.mustCall("join_job_room", map[string]any{"job_name": "r1:modifiers:Rot", "worker_id": wid})
		if e.rt.IO().RoomSize("jobs:r1:modifiers:Rot") != 1 {
			t.Fatal("join did not join the room")
		}
		c.mustCall("leave_job_room", map[string]any{"job_name": "r1:modifiers:Rot", "worker_id": wid})
		if e.rt.IO().RoomSize("jobs:r1:modifiers:Rot") != 0 {
			t.Fatal("leave did not leave the room")
		}
	})
}

// TestSocketEventsReachRooms: committed events reach the members of their
// rooms with the contract's names and payloads, and nobody else.
func TestSocketEventsReachRooms(t *testing.T) {
	t.Parallel()
	eachRealtime(t, func(t *testing.T, e *env) {
		ui := mustDialSIO(t, e.url, e.bob)
		ui.mustCall("join_room", map[string]any{"room_id": "r1"})
		other := mustDialSIO(t, e.url, e.bob)
		other.mustCall("join_room", map[string]any{"room_id": "r2"})

		job := e.registerJob(e.alice, "r1", "modifiers", "Rot")
		ui.waitEvent("jobs_invalidate", 2*time.Second, nil)
		worker := mustDialSIO(t, e.url, e.alice)
		worker.mustCall("join_job_room", map[string]any{"job_name": "r1:modifiers:Rot", "worker_id": job["worker_id"]})

		id := e.submit(e.bob, "r1", "r1:modifiers:Rot", map[string]any{"n": 1})
		ta := worker.waitEvent("task_available", 2*time.Second, nil)
		if ta.Payload["job_name"] != "r1:modifiers:Rot" || ta.Payload["room_id"] != "r1" || ta.Payload["task_id"] != id || len(ta.Payload) != 3 {
			t.Fatalf("task_available payload %v", ta.Payload)
		}
		ts := ui.waitEvent("task_status_event", 2*time.Second, nil)
		want := []string{"completed_at", "created_at", "error", "id", "name", "queue_position", "room_id", "started_at", "status", "worker_id"}
		var keys []string
		for k := range ts.Payload {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, want) {
			t.Fatalf("task_status_event keys %v, want %v", keys, want)
		}
		if ts.Payload["id"] != id || ts.Payload["status"] != "pending" || ts.Payload["queue_position"] != 1.0 || ts.Payload["worker_id"] != nil {
			t.Fatalf("task_status_event payload %v", ts.Payload)
		}
		e.claim(e.alice, job["worker_id"].(string))
		ui.waitEvent("task_status_event", 2*time.Second, func(p map[string]any) bool { return p["status"] == "claimed" })
		if got := other.eventsNamed("task_status_event"); len(got) != 0 {
			t.Fatalf("room r2 received r1's events: %v", got)
		}
		if got := ui.eventsNamed("task_available"); len(got) != 0 {
			t.Fatalf("a UI outside the jobs room received task_available: %v", got)
		}
	})
}

// TestSocketDisconnectCleansWorker: a worker whose socket dies while it holds
// a claimed task is cleaned up after the grace window; the room's UI sees the
// task fail with "Worker disconnected".
func TestSocketDisconnectCleansWorker(t *testing.T) {
	t.Parallel()
	eachRealtime(t, func(t *testing.T, e *env) {
		job := e.registerJob(e.alice, "r1", "modifiers", "Rot")
		wid := job["worker_id"].(string)
		ui := mustDialSIO(t, e.url, e.bob)
		ui.mustCall("join_room", map[string]any{"room_id": "r1"})
		w := mustDialSIO(t, e.url, e.alice)
		w.mustCall("join_job_room", map[string]any{"job_name": "r1:modifiers:Rot", "worker_id": wid})
		id := e.submit(e.bob, "r1", "r1:modifiers:Rot", nil)
		e.claim(e.alice, wid)

		w.drop()
		dropped := time.Now()
		ev := ui.waitEvent("task_status_event", 5*time.Second, func(p map[string]any) bool { return p["status"] == "failed" })
		if ev.Payload["id"] != id || ev.Payload["error"] != "Worker disconnected" || ev.Payload["worker_id"] != wid {
			t.Fatalf("failure event %v", ev.Payload)
		}
		grace := realtimeCfg().DisconnectGrace
		if lag := ev.At.Sub(dropped); lag < grace || lag > grace+time.Second {
			t.Fatalf("task failed %s after the socket dropped, want within [grace, grace+1s] = [%s, %s]", lag, grace, grace+time.Second)
		}
		e.do(e.alice, "PATCH", api+"/workers/"+wid, nil).problem(404, "worker-not-found")
		ui.waitEvent("jobs_invalidate", 2*time.Second, nil)
	})
}

// TestSocketReconnectWithinGraceKeepsClaims: re-joining with the same worker
// id inside the grace window keeps the worker and its claimed task.
func TestSocketReconnectWithinGraceKeepsClaims(t *testing.T) {
	t.Parallel()
	eachRealtime(t, func(t *testing.T, e *env) {
		job := e.registerJob(e.alice, "r1", "modifiers", "Rot")
		wid := job["worker_id"].(string)
		w := mustDialSIO(t, e.url, e.alice)
		w.mustCall("join_job_room", map[string]any{"job_name": "r1:modifiers:Rot", "worker_id": wid})
		id := e.submit(e.bob, "r1", "r1:modifiers:Rot", nil)
		e.claim(e.alice, wid)

		w.drop()
		w2 := mustDialSIO(t, e.url, e.alice)
		w2.mustCall("join_job_room", map[string]any{"job_name": "r1:modifiers:Rot", "worker_id": wid})
		time.Sleep(realtimeCfg().DisconnectGrace + 700*time.Millisecond)
		if st := e.do(e.alice, "GET", api+"/tasks/"+id, nil).want(200).M()["status"]; st != "claimed" {
			t.Fatalf("task is %v after a reconnect within grace, want claimed", st)
		}
		e.do(e.alice, "PATCH", api+"/workers/"+wid, nil).want(200)
	})
}

// TestSocketKeepsBoundWorkerAlive: an open socket bound to a worker refreshes
// its heartbeat without any REST heartbeat.
func TestSocketKeepsBoundWorkerAlive(t *testing.T) {
	t.Parallel()
	eachRealtime(t, func(t *testing.T, e *env) {
		job := e.registerJob(e.alice, "r1", "modifiers", "Rot")
		wid := job["worker_id"].(string)
		heartbeat := func() string {
			for _, w := range e.do(e.admin, "GET", api+"/workers", nil).want(200).Items() {
				if w["id"] == wid {
					return w["last_heartbeat"].(string)
				}
			}
			t.Fatal("worker gone")
			return ""
		}
		w := mustDialSIO(t, e.url, e.alice)
		w.mustCall("join_job_room", map[string]any{"job_name": "r1:modifiers:Rot", "worker_id": wid})
		first := heartbeat()
		waitFor(t, 3*time.Second, func() bool { return heartbeat() > first })
	})
}

// TestSocketAnonymousUnderPublicReads: with public reads, a UI without a token
// may follow a room but may not act for a worker; a wrong token is still refused.
func TestSocketAnonymousUnderPublicReads(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		e := setup(t, db, withRealtime(realtimeCfg()), func(o *setupOpts) { o.publicReads = true })
		if _, err := dialSIO(t, e.url, "jl_wrong"); err == nil {
			t.Fatal("a wrong token was accepted")
		}
		ui := mustDialSIO(t, e.url, "")
		ui.mustCall("join_room", map[string]any{"room_id": "pub"})
		wid := e.registerJob(e.alice, "pub", "modifiers", "Job")["worker_id"].(string)
		ui.waitEvent("jobs_invalidate", 2*time.Second, nil)
		if a := ui.call("join_job_room", map[string]any{"job_name": "pub:modifiers:Job", "worker_id": wid}); a["status"] != 401.0 {
			t.Fatalf("anonymous worker join: %v, want 401", a)
		}
	})
}
