package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
)

// roomHost is a small host application answering joblib's room questions:
// "open" allows everything, "ro" allows reads only, "slow" never answers in
// time, anything else is refused. It records every question.
type roomHost struct {
	srv   *httptest.Server
	mu    sync.Mutex
	got   []roomQuestion
	admin string // this bearer token may use every room but "slow"
	// withdrawn rooms are refused to everybody but admin.
	withdrawn map[string]bool
	// own maps a bearer token to the one room (besides "open" and "ro") it
	// may use, as a host giving each user a room of their own would.
	own map[string]string
}

type roomQuestion struct {
	UserID *string `json:"user_id"`
	RoomID string  `json:"room_id"`
	Access string  `json:"access"`
	Auth   string  `json:"-"`
}

func newRoomHost(t *testing.T) *roomHost {
	h := &roomHost{}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var q roomQuestion
		if r.Method != "POST" || r.Header.Get("Content-Type") != "application/json" || json.NewDecoder(r.Body).Decode(&q) != nil {
			http.Error(w, "bad question", 400)
			return
		}
		q.Auth = r.Header.Get("Authorization")
		h.mu.Lock()
		h.got = append(h.got, q)
		admin := h.admin != "" && q.Auth == "Bearer "+h.admin
		withdrawn := h.withdrawn[q.RoomID]
		own := h.own[strings.TrimPrefix(q.Auth, "Bearer ")] == q.RoomID
		h.mu.Unlock()
		switch {
		case withdrawn && !admin:
			http.Error(w, "withdrawn", http.StatusForbidden)
		case q.RoomID == "slow":
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		case q.RoomID == "open", q.RoomID == "ro" && q.Access == "read", admin, own:
			w.WriteHeader(http.StatusNoContent)
		default:
			http.Error(w, "no", http.StatusForbidden)
		}
	}))
	t.Cleanup(h.srv.Close)
	return h
}

// withdraw makes the host refuse room from now on (but to admin).
func (h *roomHost) withdraw(room string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.withdrawn == nil {
		h.withdrawn = map[string]bool{}
	}
	h.withdrawn[room] = true
}

func (h *roomHost) questions() []roomQuestion {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]roomQuestion(nil), h.got...)
}

// countBy counts the questions about room asked with token.
func (h *roomHost) countBy(token, room, access string) int {
	n := 0
	for _, q := range h.questions() {
		if q.RoomID == room && q.Access == access && q.Auth == "Bearer "+token {
			n++
		}
	}
	return n
}

func (h *roomHost) count(room, access string) int {
	n := 0
	for _, q := range h.questions() {
		if q.RoomID == room && q.Access == access {
			n++
		}
	}
	return n
}

// hostedEnv starts an API whose room auth asks host, with the room auth
// configuration changed by tune, and makes its admin host's admin.
func hostedEnv(t *testing.T, db *models.DB, host *roomHost, tune func(*server.Config), rc server.RealtimeConfig) (*env, server.Config) {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.RoomAuth = server.DefaultRoomAuthConfig()
	cfg.RoomAuth.URL = host.srv.URL
	tune(&cfg)
	e := setup(t, db, withServer(cfg), withRealtime(rc))
	host.mu.Lock()
	host.admin = e.admin
	host.mu.Unlock()
	return e, cfg
}

func roomAuthEnv(t *testing.T, db *models.DB, ra server.RoomAuthConfig) *env {
	cfg := server.DefaultConfig()
	cfg.RoomAuth = ra
	return setup(t, db, withServer(cfg), withRealtime(realtimeCfg()))
}

// With JOBLIB_ROOM_AUTH_URL set, REST calls on a room and socket joins ask
// the host (the caller's token forwarded), answer 403 when it refuses and
// 503 when it does not answer in time; answers are cached briefly.
func TestRoomAuthDelegatedToHost(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		host := newRoomHost(t)
		ra := server.DefaultRoomAuthConfig()
		ra.URL = host.srv.URL + "/joblib/room-access"
		ra.Timeout = 300 * time.Millisecond
		ra.CacheTTL = time.Minute
		e := roomAuthEnv(t, db, ra)
		host.mu.Lock()
		host.admin = e.admin
		host.mu.Unlock()
		alice, err := e.svc.AuthenticateToken(context.Background(), e.alice)
		if err != nil {
			t.Fatal(err)
		}

		e.registerJob(e.alice, "open", "modifiers", "J")
		e.submit(e.alice, "open", "open:modifiers:J", nil)
		e.do(e.alice, "GET", api+"/rooms/open/jobs", nil).want(200)
		e.do(e.alice, "GET", api+"/rooms/open/tasks", nil).want(200)
		qs := host.questions()
		if len(qs) != 2 || qs[0].Access != "write" || qs[1].Access != "read" || qs[0].UserID == nil || *qs[0].UserID != alice.ID.String() ||
			qs[0].Auth != "Bearer "+e.alice {
			t.Fatalf("questions %+v", qs) // one write and one read question, the rest cached
		}

		p := e.do(e.alice, "PUT", api+"/rooms/locked/jobs", map[string]any{"category": "modifiers", "name": "J"}).problem(403, "forbidden")
		if p["detail"] != "No write access to room 'locked'" {
			t.Fatalf("detail %v", p["detail"])
		}
		for _, path := range []string{"/rooms/locked/jobs", "/rooms/locked/tasks", "/rooms/locked/workers", "/rooms/locked/providers",
			"/rooms/locked/jobs/open:modifiers:J", "/rooms/locked/jobs/open:modifiers:J/tasks", "/rooms/locked/providers/open:data:x/info"} {
			e.do(e.alice, "GET", api+path, nil).problem(403, "forbidden")
		}
		e.do(e.alice, "POST", api+"/rooms/locked/tasks/open:modifiers:J", map[string]any{"payload": map[string]any{}}).problem(403, "forbidden")
		e.registerProvider(e.alice, "locked", "data", "x").problem(403, "forbidden")
		e.do(e.alice, "GET", api+"/rooms/locked/providers/open:data:x", nil).problem(403, "forbidden")

		e.do(e.alice, "GET", api+"/rooms/ro/jobs", nil).want(200)
		e.do(e.alice, "POST", api+"/rooms/ro/tasks/open:modifiers:J", map[string]any{"payload": map[string]any{}}).problem(403, "forbidden")

		// The host being slow is an outage: 503, fail closed.
		start := time.Now()
		p = e.do(e.alice, "GET", api+"/rooms/slow/jobs", nil).problem(503, "room-auth-unavailable")
		if time.Since(start) > 4*time.Second {
			t.Fatalf("the slow host held the request %s", time.Since(start))
		}
		e.do(e.alice, "PUT", api+"/rooms/slow/jobs", map[string]any{"category": "modifiers", "name": "S"}).problem(503, "room-auth-unavailable")

		// joblib's own rooms are not the host's.
		e.registerJob(e.admin, "@global", "modifiers", "G")
		e.do(e.alice, "GET", api+"/rooms/@global/jobs", nil).want(200)
		for _, q := range host.questions() {
			if strings.HasPrefix(q.RoomID, "@") {
				t.Fatalf("asked about %s", q.RoomID)
			}
		}
		// A task is read with read access to its room.
		lockedTask := e.submit(e.admin, "@global", "open:modifiers:J", nil)
		e.do(e.alice, "GET", api+"/tasks/"+lockedTask, nil).want(200)
		hidden := e.do(e.admin, "POST", api+"/rooms/locked/tasks/open:modifiers:J", map[string]any{"payload": map[string]any{}}).want(202).M()["id"].(string)
		e.do(e.alice, "GET", api+"/tasks/"+hidden, nil).problem(403, "forbidden")
		e.do(e.alice, "GET", api+"/tasks/"+hidden, nil, "Prefer: wait=1").problem(403, "forbidden")
		if n := e.total(api + "/rooms/open/tasks"); n != 1 {
			t.Fatalf("%d tasks", n)
		}
		if host.countBy(e.alice, "open", "read") != 1 || host.countBy(e.alice, "locked", "write") != 1 || host.countBy(e.alice, "locked", "read") != 1 {
			t.Fatalf("answers not cached: %+v", host.questions())
		}

		// Sockets: join_room asks for read access with the socket's token.
		c := mustDialSIO(t, e.url, e.bob)
		c.mustCall("join_room", map[string]any{"room_id": "open"})
		c.mustCall("join_room", map[string]any{"room_id": "ro"})
		if a := c.call("join_room", map[string]any{"room_id": "locked"}); a["ok"] != false || a["status"] != float64(403) {
			t.Fatalf("locked join %v", a)
		}
		if a := c.call("join_room", map[string]any{"room_id": "slow"}); a["ok"] != false || a["status"] != float64(503) {
			t.Fatalf("slow join %v", a)
		}
		w := e.do(e.bob, "POST", api+"/workers", nil).want(201).M()["id"].(string)
		e.registerJob(e.bob, "open", "modifiers", "J", map[string]any{"worker_id": w})
		if a := c.call("join_job_room", map[string]any{"job_name": "locked:modifiers:J", "worker_id": w}); a["ok"] != false || a["status"] != float64(403) {
			t.Fatalf("job room join in a locked room %v", a)
		}
		c.mustCall("join_job_room", map[string]any{"job_name": "open:modifiers:J", "worker_id": w})
		var bobAsked bool
		for _, q := range host.questions() {
			if q.RoomID == "locked" && q.Auth == "Bearer "+e.bob && q.Access == "read" {
				bobAsked = true
			}
		}
		if !bobAsked {
			t.Fatalf("socket join did not forward the token: %+v", host.questions())
		}
		// Only the allowed room's events reach the socket.
		e.submit(e.alice, "open", "open:modifiers:J", nil)
		c.waitEvent("task_status_event", 5*time.Second, nil)
	})
}

// A host that cannot be reached fails closed (503) unless configured to fail
// open; with a zero cache TTL every call asks again.
func TestRoomAuthHostDown(t *testing.T) {
	t.Parallel()
	down := httptest.NewServer(http.NotFoundHandler())
	downURL := down.URL
	down.Close()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		ra := server.DefaultRoomAuthConfig()
		ra.URL = downURL
		e := roomAuthEnv(t, db, ra)
		e.do(e.alice, "GET", api+"/rooms/r/jobs", nil).problem(503, "room-auth-unavailable")
		e.do(e.alice, "POST", api+"/rooms/r/tasks/"+rotate, map[string]any{"payload": map[string]any{}}).problem(503, "room-auth-unavailable")
		c := mustDialSIO(t, e.url, e.alice)
		if a := c.call("join_room", map[string]any{"room_id": "r"}); a["ok"] != false || a["status"] != float64(503) {
			t.Fatalf("join %v", a)
		}

		ra.FailOpen = true
		open := roomAuthEnv(t, db, ra)
		open.do(open.alice, "GET", api+"/rooms/r/jobs", nil).want(200)

		host := newRoomHost(t)
		ra = server.DefaultRoomAuthConfig()
		ra.URL = host.srv.URL
		ra.CacheTTL = 0
		nocache := roomAuthEnv(t, db, ra)
		for range 3 {
			nocache.do(nocache.alice, "GET", api+"/rooms/open/jobs", nil).want(200)
		}
		if n := host.count("open", "read"); n != 3 {
			t.Fatalf("%d questions without a cache", n)
		}
	})
}

// Finding 4 of the security pass: a socket kept a room's events after the
// host withdrew the room. Rooms a socket was granted by the host are asked
// again on the credential tick: when the host refuses, the socket leaves the
// room with room_left {room, reason} (a worker's job room too), gets none of
// its events afterwards, and keeps the rooms still granted. When the host
// cannot answer, the socket leaves too (fail closed), unless room auth fails
// open.
func TestSocketLeavesWithdrawnRoom(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		host := newRoomHost(t)
		e, cfg := hostedEnv(t, db, host, func(c *server.Config) {
			c.CredentialCacheTTL = 400 * time.Millisecond // a tick every 100 ms
			c.RoomAuth.CacheTTL = time.Second
		}, realtimeCfg())
		job := e.registerJob(e.alice, "open", "modifiers", "J")
		worker := mustDialSIO(t, e.url, e.alice)
		worker.mustCall("join_job_room", map[string]any{"job_name": "open:modifiers:J", "worker_id": job["worker_id"]})
		ui := mustDialSIO(t, e.url, e.bob)
		ui.mustCall("join_room", map[string]any{"room_id": "open"})
		ui.mustCall("join_room", map[string]any{"room_id": "ro"})
		before := e.submit(e.admin, "open", "open:modifiers:J", nil)
		ui.waitEvent("task_status_event", 5*time.Second, func(m map[string]any) bool { return m["id"] == before })
		worker.waitEvent("task_available", 5*time.Second, nil)

		host.withdraw("open")
		withdrawn := time.Now()
		// REST refuses once the cached answer is older than its TTL; the
		// socket leaves within about the same time.
		left := ui.waitEvent("room_left", 5*time.Second, nil)
		if left.Payload["room"] != "open" || left.Payload["reason"] != "forbidden" {
			t.Fatalf("room_left %v", left.Payload)
		}
		if d := left.At.Sub(withdrawn); d > cfg.RoomAuth.CacheTTL+time.Second {
			t.Fatalf("room_left %s after the host withdrew the room (cache TTL %s)", d, cfg.RoomAuth.CacheTTL)
		}
		wleft := worker.waitEvent("room_left", 5*time.Second, nil)
		if wleft.Payload["room"] != "open" || wleft.Payload["job_name"] != "open:modifiers:J" || wleft.Payload["reason"] != "forbidden" {
			t.Fatalf("worker's room_left %v", wleft.Payload)
		}
		e.do(e.bob, "GET", api+"/rooms/open/jobs", nil).problem(403, "forbidden")
		after := e.submit(e.admin, "open", "open:modifiers:J", nil)
		marker := e.submit(e.admin, "ro", "open:modifiers:J", nil)
		// Events reach a socket in order: once the later one of the room it
		// kept is in, the withdrawn room's would have been too.
		ui.waitEvent("task_status_event", 5*time.Second, func(m map[string]any) bool { return m["id"] == marker })
		for _, ev := range ui.eventsNamed("task_status_event") {
			if ev.Payload["id"] == after {
				t.Fatalf("the socket got an event of the room it was refused: %v", ev.Payload)
			}
		}
		if n := len(ui.eventsNamed("room_left")); n != 1 {
			t.Fatalf("%d room_left events, want 1 (the granted room stays)", n)
		}
		if n := len(worker.eventsNamed("task_available")); n != 1 {
			t.Fatalf("the worker got %d task_available, want the one before the withdrawal", n)
		}
		// Joining again is refused like any join.
		if a := ui.call("join_room", map[string]any{"room_id": "open"}); a["status"] != float64(403) {
			t.Fatalf("re-join %v", a)
		}

		// The host goes away. A socket keeps the room it holds for the
		// outage grace (events of the room still reach it; new calls about
		// the room fail closed), then leaves it; with no grace it leaves at
		// the first unanswered re-check; failing open, it stays.
		for _, tc := range []struct {
			name     string
			failOpen bool
			grace    time.Duration
		}{{"no grace", false, 0}, {"grace", false, 3 * time.Second}, {"fail open", true, 0}} {
			down := newRoomHost(t)
			e2, c := hostedEnv(t, db, down, func(c *server.Config) {
				c.CredentialCacheTTL = cfg.CredentialCacheTTL
				c.RoomAuth.CacheTTL, c.RoomAuth.FailOpen, c.RoomAuth.OutageGrace = cfg.RoomAuth.CacheTTL, tc.failOpen, tc.grace
			}, realtimeCfg())
			e2.registerJob(e2.admin, "@global", "modifiers", "J")
			task := e2.submit(e2.admin, "open", "@global:modifiers:J", nil)
			s := mustDialSIO(t, e2.url, e2.bob)
			s.mustCall("join_room", map[string]any{"room_id": "open"})
			down.srv.Close()
			hostDown := time.Now()
			time.Sleep(c.RoomAuth.CacheTTL + 700*time.Millisecond)
			got := s.eventsNamed("room_left")
			switch {
			case tc.grace == 0 && !tc.failOpen && (len(got) != 1 || got[0].Payload["reason"] != "unavailable" || got[0].Payload["room"] != "open"):
				t.Fatalf("%s, host down: room_left %v", tc.name, got)
			case (tc.grace > 0 || tc.failOpen) && len(got) != 0:
				t.Fatalf("%s, host down for %s: room_left %v", tc.name, time.Since(hostDown), got)
			}
			if tc.grace == 0 {
				continue
			}
			// The held room still delivers, while a call about the room
			// fails closed.
			if !tc.failOpen {
				e2.do(e2.bob, "GET", api+"/rooms/open/jobs", nil).problem(503, "room-auth-unavailable")
			}
			e2.do(e2.admin, "PATCH", api+"/tasks/"+task, map[string]any{"status": "cancelled"}).want(200)
			s.waitEvent("task_status_event", 5*time.Second, func(m map[string]any) bool { return m["id"] == task && m["status"] == "cancelled" })
			// Past the grace (counted from the host's last answer, the join's)
			// the room goes.
			left := s.waitEvent("room_left", tc.grace+5*time.Second, nil)
			if left.Payload["reason"] != "unavailable" || left.Payload["room"] != "open" {
				t.Fatalf("%s: room_left %v", tc.name, left.Payload)
			}
			if d := left.At.Sub(hostDown); d < tc.grace-c.RoomAuth.CacheTTL {
				t.Fatalf("%s: left the room %s after the host went down, within the grace of %s", tc.name, d, tc.grace)
			}
		}
	})
}

// Finding 4 of the security pass, connection state recovery: a recovered
// session got its rooms back without asking the host. Now the host is asked
// again: a withdrawn room is not restored, the client hears room_left for
// it, and nothing of it is replayed, while the rooms still granted are
// restored with what they missed.
func TestRecoveredSocketAsksHostAgain(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		host := newRoomHost(t)
		rc := realtimeCfg()
		rc.RecoveryWindow = time.Minute
		e, cfg := hostedEnv(t, db, host, func(c *server.Config) { c.RoomAuth.CacheTTL = 500 * time.Millisecond }, rc)
		e.registerJob(e.admin, "@global", "modifiers", "J")
		ui, first, err := dialSIOAuth(t, e.url, map[string]any{"token": e.bob, "recover": true})
		if err != nil {
			t.Fatal(err)
		}
		ui.mustCall("join_room", map[string]any{"room_id": "open"})
		ui.mustCall("join_room", map[string]any{"room_id": "ro"})
		seen := e.submit(e.admin, "open", "@global:modifiers:J", nil)
		offset := ui.waitEvent("task_status_event", 5*time.Second, func(m map[string]any) bool { return m["id"] == seen }).Offset
		if offset == "" {
			t.Fatal("no offset on a UI room event")
		}
		ui.drop()
		waitFor(t, 5*time.Second, func() bool { return e.rt.IO().NumSockets() == 0 })
		host.withdraw("open")
		missedOpen := e.submit(e.admin, "open", "@global:modifiers:J", nil)
		missedRO := e.submit(e.admin, "ro", "@global:modifiers:J", nil)
		time.Sleep(cfg.RoomAuth.CacheTTL) // the join's answer is too old to reuse
		asked := host.countBy(e.bob, "open", "read")

		back, reply, err := dialSIOAuth(t, e.url, map[string]any{"token": e.bob, "recover": true, "pid": first["pid"], "offset": offset})
		if err != nil {
			t.Fatal(err)
		}
		if reply["sid"] != first["sid"] {
			t.Fatalf("not recovered: %v, first %v", reply, first)
		}
		left := back.waitEvent("room_left", 5*time.Second, nil)
		if left.Payload["room"] != "open" || left.Payload["reason"] != "forbidden" {
			t.Fatalf("room_left %v", left.Payload)
		}
		if host.countBy(e.bob, "open", "read") != asked+1 {
			t.Fatalf("the host was not asked again about the recovered room: %+v", host.questions())
		}
		back.waitEvent("task_status_event", 5*time.Second, func(m map[string]any) bool { return m["id"] == missedRO })
		live := e.submit(e.admin, "open", "@global:modifiers:J", nil)
		marker := e.submit(e.admin, "ro", "@global:modifiers:J", nil)
		back.waitEvent("task_status_event", 5*time.Second, func(m map[string]any) bool { return m["id"] == marker })
		for _, ev := range back.eventsNamed("task_status_event") {
			if id := ev.Payload["id"]; id == missedOpen || id == live {
				t.Fatalf("the recovered socket got an event of the withdrawn room: %v", ev.Payload)
			}
		}
	})
}
