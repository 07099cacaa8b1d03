package server_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/internal/limits"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
)

// poll sends an Engine.IO polling GET for sid and returns the status.
func poll(t *testing.T, base, sid string) int {
	t.Helper()
	res, err := http.Get(base + "/socket.io/?EIO=4&transport=polling&sid=" + sid)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

// Finding 7 of the security pass: each polling request with a made-up
// session id (`sid=x.<random uuid>`) cost a node lookup in the database.
// Now a run found not live is remembered briefly, and lookups of runs in
// neither cache are a per-address budget: a probe of many made-up ids costs
// at most that budget, one made-up id asked again costs one lookup, and a
// node whose lease appears after it was looked up is still found within a
// second.
func TestUnknownSessionProbeIsCheap(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		e := setup(t, db, withRealtime(realtimeCfg()))
		var reached atomic.Int64
		node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			reached.Add(1)
			_, _ = w.Write([]byte("6"))
		}))
		t.Cleanup(node.Close)

		// One made-up id, asked again and again: one lookup for each second
		// the negative answer is kept (one, unless the machine is so loaded
		// that 50 requests take over a second).
		run := uuid.NewString()
		start := time.Now()
		for range 50 {
			if st := poll(t, e.url, "x."+run); st != http.StatusBadRequest {
				t.Fatalf("unknown session: %d", st)
			}
		}
		if n, most := e.rt.NodeLookups(), 1+int64(time.Since(start)/time.Second); n < 1 || n > most {
			t.Fatalf("%d node lookups for one unknown run asked 50 times in %s (want 1 to %d)", n, time.Since(start), most)
		}
		// The run's node starts now: it is found within the time a
		// negative answer is kept (a second), not later.
		if err := e.db.Q(context.Background()).AcquireNodeLease(run, "late-node", node.Listener.Addr().String(), time.Minute); err != nil {
			t.Fatal(err)
		}
		started := time.Now()
		waitFor(t, 3*time.Second, func() bool { return poll(t, e.url, "x."+run) == http.StatusOK })
		if d := time.Since(started); d > 1500*time.Millisecond || reached.Load() == 0 {
			t.Fatalf("a node that started was found after %s (reached %d)", d, reached.Load())
		}

		// Many made-up ids from one address: at most its budget of lookups.
		before := e.rt.NodeLookups()
		refused := 0
		for range 200 {
			switch st := poll(t, e.url, "x."+uuid.NewString()); st {
			case http.StatusTooManyRequests:
				refused++
			case http.StatusBadRequest:
			default:
				t.Fatalf("made-up session: %d", st)
			}
		}
		if n := e.rt.NodeLookups() - before; n > 40 {
			t.Fatalf("200 made-up session ids cost %d node lookups; the budget is 20 at once and 5/s", n)
		}
		if refused < 150 || e.api.Rejections().Value(limits.SessionLookups) != float64(refused) {
			t.Fatalf("%d refused, %v counted", refused, e.api.Rejections().Value(limits.SessionLookups))
		}
		// The live node's sessions are still forwarded: it is cached.
		if st := poll(t, e.url, "x."+run); st != http.StatusOK {
			t.Fatalf("the live node's session after the probe: %d", st)
		}
	})
}

// Finding 7 of the security pass, room authorization: random room names
// cost a host question each, and past JOBLIB_ROOM_AUTH_CACHE_SIZE answers
// the whole cache was emptied for everyone. Now questions whose answer is
// not cached are a per-address budget (REST and socket joins alike), and a
// full cache drops its least recently used answer: a room in use keeps its
// answer however many random rooms come by.
func TestRoomProbeIsCheap(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		host := newRoomHost(t)
		tune := func(c *server.Config) {
			c.RoomAuth.CacheTTL = time.Minute
			c.RoomAuth.Rate, c.RoomAuth.Burst = 5, 20
			c.TrustedProxies = []string{"127.0.0.1"} // the probe comes through a proxy
		}
		const prober, other = "X-Forwarded-For: 203.0.113.7", "X-Forwarded-For: 203.0.113.8"
		e, _ := hostedEnv(t, db, host, tune, realtimeCfg())
		e.do(e.alice, "GET", api+"/rooms/open/jobs", nil).want(200)
		refused := 0
		for i := range 200 {
			r := e.do(e.alice, "GET", api+fmt.Sprintf("/rooms/probe-%d/jobs", i), nil, prober)
			switch r.Status {
			case http.StatusTooManyRequests:
				r.problem(429, "rate-limited")
				if r.Header.Get("Retry-After") == "" {
					t.Fatal("429 without Retry-After")
				}
				refused++
			case http.StatusForbidden:
			default:
				t.Fatalf("probe: %d %s", r.Status, r.Body)
			}
		}
		if n := len(host.questions()); n > 1+40 {
			t.Fatalf("200 random rooms cost %d host questions; the budget is 20 at once and 5/s", n)
		}
		if refused < 150 {
			t.Fatalf("%d refused", refused)
		}
		// A cached answer costs nothing: the room in use still answers.
		e.do(e.alice, "GET", api+"/rooms/open/jobs", nil, prober).want(200)
		// Another client behind the proxy has its own budget.
		e.do(e.alice, "GET", api+"/rooms/elsewhere/jobs", nil, other).want(403)
		// Socket joins are budgeted too (this socket's address is the
		// proxy's own: it sends no forwarding header).
		asked := len(host.questions())
		c := mustDialSIO(t, e.url, e.bob)
		limited := 0
		for i := range 80 {
			switch a := c.call("join_room", map[string]any{"room_id": fmt.Sprintf("sock-probe-%d", i)}); a["status"] {
			case float64(429):
				limited++
			case float64(403):
			default:
				t.Fatalf("join probe: %v", a)
			}
		}
		if n := len(host.questions()) - asked; n > 40 || limited < 40 {
			t.Fatalf("80 socket joins of random rooms cost %d host questions (%d refused); the budget is 20 at once and 5/s", n, limited)
		}

		// Least recently used eviction: a room in use survives random rooms
		// filling the cache many times over.
		lruHost := newRoomHost(t)
		l, _ := hostedEnv(t, db, lruHost, func(c *server.Config) {
			tune(c)
			c.RoomAuth.Rate = 0 // no budget: only the cache is looked at
			c.RoomAuth.CacheSize = 50
		}, realtimeCfg())
		for i := range 300 {
			if i%10 == 0 {
				l.do(l.alice, "GET", api+"/rooms/open/jobs", nil).want(200)
			}
			l.do(l.alice, "GET", api+fmt.Sprintf("/rooms/fill-%d/jobs", i), nil).want(403)
		}
		if n := lruHost.count("open", "read"); n != 1 {
			t.Fatalf("the room in use was asked about %d times: the cache dropped it for random rooms", n)
		}
		if n := lruHost.count("fill-0", "read"); n != 1 {
			t.Fatalf("fill-0: %d", n)
		}
		l.do(l.alice, "GET", api+"/rooms/fill-0/jobs", nil).want(403)
		if n := lruHost.count("fill-0", "read"); n != 2 {
			t.Fatalf("fill-0 asked %d times: the least recently used answer was not the one dropped", n)
		}
	})
}

// Made-up bearer tokens (finding 7's class: an unauthenticated request that
// costs a database lookup each). A credential refused is remembered for the
// cache TTL, and refusals are a per-address budget: past it a credential
// that is not cached answers 429 without a lookup, over REST and sockets.
func TestMadeUpTokensAreCheap(t *testing.T) {
	t.Parallel()
	cfg := server.DefaultConfig()
	// 20 at once, then one every 100 s: no token comes back between the
	// loop below and the socket dial after it, however slow the machine
	// (at 5/s one came back within the dial about one run in six).
	cfg.AuthFailureRate, cfg.AuthFailureBurst = 0.01, 20
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		e := setup(t, db, withServer(cfg), withRealtime(realtimeCfg()))
		e.do(e.alice, "GET", api+"/workers", nil).want(200) // cached from now on
		bad := "jl_" + uuid.NewString()
		before := e.api.CredentialLookups()
		for range 30 {
			if p := e.do(bad, "GET", api+"/workers", nil).problem(401, "unauthorized"); p["detail"] == nil {
				t.Fatal("no detail")
			}
		}
		if n := e.api.CredentialLookups() - before; n != 1 {
			t.Fatalf("one bad token sent 30 times cost %d lookups", n)
		}
		before = e.api.CredentialLookups()
		refused := 0
		for range 200 {
			r := e.do("jl_"+uuid.NewString(), "GET", api+"/workers", nil)
			switch r.Status {
			case http.StatusTooManyRequests:
				r.problem(429, "rate-limited")
				refused++
			case http.StatusUnauthorized:
			default:
				t.Fatalf("made-up token: %d %s", r.Status, r.Body)
			}
		}
		if n := e.api.CredentialLookups() - before; n > 40 {
			t.Fatalf("200 made-up tokens cost %d lookups; the budget is 20 at once", n)
		}
		if refused < 150 || e.api.Rejections().Value(limits.AuthFailures) < float64(refused) {
			t.Fatalf("%d refused, %v counted", refused, e.api.Rejections().Value(limits.AuthFailures))
		}
		if _, err := dialSIO(t, e.url, "jl_"+uuid.NewString()); err == nil || err.Error() != "Too many refused credentials from this address" {
			t.Fatalf("socket with a made-up token past the budget: %v", err)
		}
		// A credential in the cache still works from that address.
		e.do(e.alice, "GET", api+"/workers", nil).want(200)
		mustDialSIO(t, e.url, e.alice)
	})
}
