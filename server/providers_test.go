package server_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// registerProvider PUTs a provider and returns the answer.
func (e *env) registerProvider(token, room, category, name string, extra ...map[string]any) resp {
	e.t.Helper()
	body := map[string]any{"category": category, "name": name, "schema": map[string]any{}}
	for _, x := range extra {
		for k, v := range x {
			body[k] = v
		}
	}
	return e.do(token, "PUT", api+"/rooms/"+room+"/providers", body)
}

// provider registers a provider (201) and returns its id.
func (e *env) provider(token, room, category, name string, extra ...map[string]any) string {
	e.t.Helper()
	return e.registerProvider(token, room, category, name, extra...).want(201).M()["id"].(string)
}

func (e *env) upload(token, providerID, hash string, body []byte) resp {
	e.t.Helper()
	return e.do(token, "POST", api+"/providers/"+providerID+"/results", body, "X-Request-Hash: "+hash)
}

func query(params map[string]string) string {
	v := url.Values{}
	for k, x := range params {
		v.Set(k, x)
	}
	if len(v) == 0 {
		return ""
	}
	return "?" + v.Encode()
}

func (e *env) readProvider(token, room, fullName string, params map[string]string, hdr ...string) resp {
	e.t.Helper()
	return e.do(token, "GET", api+"/rooms/"+room+"/providers/"+fullName+query(params), nil, hdr...)
}

// waiting reports the readers long-polling a provider result on this node.
func (e *env) waiting(providerID string, params map[string]string) int {
	c := e.svc.ResultCache().(interface{ Waiting(joblib.ResultKey) int })
	return c.Waiting(joblib.ResultKey{ProviderID: uuid.MustParse(providerID), Hash: joblib.RequestHash(params)})
}

// requests counts the provider_request emissions to a provider's room and
// checks their payload against what the server must send.
type requests struct {
	t     testing.TB
	n     atomic.Int32
	mu    sync.Mutex
	seen  []events.ProviderRequest
	unsub func()
}

func countRequests(t testing.TB, bus events.Bus, fullName string) *requests {
	r := &requests{t: t}
	r.unsub = bus.Subscribe(func(em events.Emission) {
		ev, ok := em.Event.(events.ProviderRequest)
		if !ok || em.Room != events.ProviderRoom(fullName) {
			return
		}
		r.n.Add(1)
		r.mu.Lock()
		r.seen = append(r.seen, ev)
		r.mu.Unlock()
	})
	t.Cleanup(r.unsub)
	return r
}

// fakeWorker is a provider client in process: it receives provider_request
// from the bus (as the Socket.IO layer will deliver it to providers:{name})
// and answers over HTTP the way the Python JobManager does — parse params,
// compute, POST /providers/{id}/results with X-Request-Hash = request_id.
type fakeWorker struct {
	requests atomic.Int32
	wg       sync.WaitGroup
}

func serveProvider(t testing.TB, bus events.Bus, baseURL, token, providerID, fullName string, answer func(map[string]string) []byte) *fakeWorker {
	w := &fakeWorker{}
	unsub := bus.Subscribe(func(em events.Emission) {
		ev, ok := em.Event.(events.ProviderRequest)
		if !ok || em.Room != events.ProviderRoom(fullName) || ev.ProviderName != fullName {
			return
		}
		w.requests.Add(1)
		w.wg.Add(1)
		go func() { // the bus callback must not block
			defer w.wg.Done()
			var params map[string]string
			if err := json.Unmarshal([]byte(ev.Params), &params); err != nil {
				t.Errorf("provider_request params %q: %v", ev.Params, err)
				return
			}
			if joblib.RequestHash(params) != ev.RequestID {
				t.Errorf("request_id %s is not the hash of params %s", ev.RequestID, ev.Params)
			}
			req, _ := http.NewRequest("POST", baseURL+api+"/providers/"+providerID+"/results", bytes.NewReader(answer(params)))
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("X-Request-Hash", ev.RequestID)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Errorf("upload: %v", err)
				return
			}
			res.Body.Close()
			if res.StatusCode != 204 {
				t.Errorf("upload answered %d", res.StatusCode)
			}
		}()
	})
	t.Cleanup(func() {
		unsub()
		w.wg.Wait()
	})
	return w
}

// --- test_providers.py 1–6: registration

func TestProviderRegister(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		r := e.registerProvider(e.admin, "@global", "filesystem", "local").want(201).M()
		for k, want := range map[string]any{"category": "filesystem", "name": "local", "room_id": "@global", "full_name": "@global:filesystem:local"} {
			if r[k] != want {
				t.Fatalf("%s = %v, want %v (%v)", k, r[k], want, r)
			}
		}
		for _, k := range []string{"id", "worker_id", "created_at", "schema"} {
			if r[k] == nil {
				t.Fatalf("response lacks %s: %v", k, r)
			}
		}
		if _, ok := r["user_id"]; ok {
			t.Fatalf("ProviderResponse must not expose user_id: %v", r)
		}
		if r["content_type"] != "application/json" { // beyond the contract: the type reads answer with
			t.Fatalf("content_type %v, want the default application/json", r["content_type"])
		}
		if evs := of(e.rec.take(), "providers_invalidate"); len(evs) != 1 || evs[0].Room != "room:@global" {
			t.Fatalf("providers_invalidate emissions: %v", evs)
		}

		// auto-created worker is a real worker
		ws := e.do(e.admin, "GET", api+"/workers", nil).want(200).Items()
		found := false
		for _, w := range ws {
			found = found || w["id"] == r["worker_id"]
		}
		if !found {
			t.Fatalf("auto-created worker %v not in GET /workers", r["worker_id"])
		}

		// idempotent: same id, created_at kept, 200
		again := e.registerProvider(e.admin, "@global", "filesystem", "local").want(200).M()
		if again["id"] != r["id"] || again["created_at"] != r["created_at"] {
			t.Fatalf("re-registration changed identity: %v vs %v", again, r)
		}
		if evs := of(e.rec.take(), "providers_invalidate"); len(evs) != 1 {
			t.Fatalf("re-registration emitted %d providers_invalidate, want 1", len(evs))
		}

		// explicit worker is used and echoed
		wid := e.do(e.admin, "POST", api+"/workers", nil).want(201).M()["id"].(string)
		r2 := e.registerProvider(e.admin, "@global", "filesystem", "remote", map[string]any{"worker_id": wid}).want(201).M()
		if r2["worker_id"] != wid {
			t.Fatalf("worker_id %v, want %s", r2["worker_id"], wid)
		}
		if r2["id"] == r["id"] {
			t.Fatal("different names share an id")
		}
		// someone else's or an unknown worker is 404
		bobWorker := e.do(e.bob, "POST", api+"/workers", nil).want(201).M()["id"].(string)
		e.registerProvider(e.admin, "@global", "filesystem", "x", map[string]any{"worker_id": bobWorker}).problem(404, "worker-not-found")
		e.registerProvider(e.admin, "@global", "filesystem", "x", map[string]any{"worker_id": uuid.NewString()}).problem(404, "worker-not-found")

		// same name in another room is another provider
		r3 := e.registerProvider(e.admin, "room-42", "filesystem", "local").want(201).M()
		if r3["id"] == r["id"] || r3["full_name"] != "room-42:filesystem:local" {
			t.Fatalf("room-scoped provider: %v", r3)
		}

		// request validation
		e.do(e.admin, "PUT", api+"/rooms/room-1/providers", map[string]any{"name": "n"}).problem(422, "validation-error")
		e.do(e.admin, "PUT", api+"/rooms/room-1/providers", map[string]any{"category": "c", "name": "n", "schema": []int{1}}).problem(422, "validation-error")
		e.do(e.admin, "PUT", api+"/rooms/room-1/providers", map[string]any{"category": "c", "name": "n", "content_type": "not a type"}).problem(422, "validation-error")
		// invalid room is 400 even without credentials
		e.do("", "PUT", api+"/rooms/bad@room/providers", map[string]any{"category": "c", "name": "n"}).problem(400, "invalid-room-id")
		e.do("", "PUT", api+"/rooms/room-1/providers", map[string]any{"category": "c", "name": "n"}).problem(401, "unauthorized")
	})
}

// Concurrent first registrations of one provider never answer 500: one 201,
// the rest 200, one row.
func TestProviderRegisterConcurrent(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		var created, updated atomic.Int32
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() {
				switch st := e.registerProvider(e.alice, "room-1", "filesystem", "local").Status; st {
				case 201:
					created.Add(1)
				case 200:
					updated.Add(1)
				default:
					t.Errorf("status %d", st)
				}
			})
		}
		wg.Wait()
		if created.Load() != 1 || updated.Load() != 19 {
			t.Fatalf("created %d, updated %d; want 1 and 19", created.Load(), updated.Load())
		}
		var p struct{ Total int }
		e.do(e.alice, "GET", api+"/rooms/room-1/providers", nil).want(200).JSON(&p)
		if p.Total != 1 {
			t.Fatalf("%d providers, want 1", p.Total)
		}
	})
}

// --- test_providers.py 7–11: listing and visibility

func TestProviderList(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		total := func(room string) int {
			var p struct{ Total int }
			e.do(e.alice, "GET", api+"/rooms/"+room+"/providers", nil).want(200).JSON(&p)
			return p.Total
		}
		if total("@global") != 0 || total("room-42") != 0 {
			t.Fatal("fresh database lists providers")
		}
		e.provider(e.admin, "@global", "filesystem", "g")
		if total("@global") != 1 || total("room-42") != 1 {
			t.Fatal("@global provider not visible from @global and room-42")
		}
		time.Sleep(5 * time.Millisecond)
		e.provider(e.alice, "room-42", "filesystem", "r")
		e.provider(e.admin, "@internal", "filesystem", "i")
		if got := total("room-42"); got != 2 {
			t.Fatalf("room-42 sees %d providers, want 2 (own + @global, not @internal)", got)
		}
		if total("room-99") != 1 || total("@global") != 1 || total("@internal") != 2 {
			t.Fatal("visibility: room-99 must see only @global; @internal sees its own + @global")
		}
		items := e.do(e.alice, "GET", api+"/rooms/room-42/providers", nil).want(200).Items()
		if items[0]["full_name"] != "room-42:filesystem:r" || items[1]["full_name"] != "@global:filesystem:g" {
			t.Fatalf("not newest first: %v", items)
		}
		var page struct {
			Items []any
			Total int
			Limit int
		}
		e.do(e.alice, "GET", api+"/rooms/room-42/providers?limit=0", nil).want(200).JSON(&page)
		if len(page.Items) != 0 || page.Total != 2 || page.Limit != 0 {
			t.Fatalf("count-only page: %+v", page)
		}
		e.do(e.alice, "GET", api+"/rooms/room-42/providers?limit=501", nil).problem(422, "validation-error")
		e.do(e.alice, "GET", api+"/rooms/bad:room/providers", nil).problem(400, "invalid-room-id")
	})
}

// --- test_providers.py 12–14: info

func TestProviderInfo(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		schema := map[string]any{"type": "object", "properties": map[string]any{"path": map[string]any{"type": "string", "default": "/"}}}
		e.registerProvider(e.alice, "room-42", "filesystem", "local", map[string]any{"schema": schema}).want(201)
		info := e.do(e.alice, "GET", api+"/rooms/room-42/providers/room-42:filesystem:local/info", nil).want(200).M()
		got, _ := json.Marshal(info["schema"])
		want, _ := json.Marshal(schema)
		if string(got) != string(want) {
			t.Fatalf("schema %s, want %s", got, want)
		}
		m := e.do(e.alice, "GET", api+"/rooms/room-99/providers/room-42:filesystem:local/info", nil).problem(404, "provider-not-found")
		if m["detail"] != "Provider 'room-42:filesystem:local' not accessible from room 'room-99'" {
			t.Fatalf("detail %v", m["detail"])
		}
		m = e.do(e.alice, "GET", api+"/rooms/room-42/providers/room-42:filesystem:nope/info", nil).problem(404, "provider-not-found")
		if m["detail"] != "Provider 'room-42:filesystem:nope' not found" {
			t.Fatalf("detail %v", m["detail"])
		}
		m = e.do(e.alice, "GET", api+"/rooms/room-42/providers/justaname/info", nil).problem(404, "provider-not-found")
		if m["detail"] != "Invalid provider name format: justaname" {
			t.Fatalf("detail %v", m["detail"])
		}
		// names may contain '/' and ':'; the /info suffix still wins
		e.provider(e.alice, "room-42", "filesystem", "a/b:c")
		info = e.do(e.alice, "GET", api+"/rooms/room-42/providers/room-42:filesystem:a/b:c/info", nil).want(200).M()
		if info["name"] != "a/b:c" {
			t.Fatalf("name %v", info["name"])
		}
		// the contract's quirk: through @global any room's provider is reachable
		e.do(e.alice, "GET", api+"/rooms/@global/providers/room-42:filesystem:local/info", nil).want(200)
		e.do(e.alice, "GET", api+"/rooms/bad@room/providers/room-42:filesystem:local/info", nil).problem(400, "invalid-room-id")
	})
}

// --- test_providers.py 15–20, test_client.py 35: reads

func TestProviderReadTimeoutDispatchesOnce(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		e.provider(e.admin, "@global", "filesystem", "local")
		reqs := countRequests(t, e.bus, "@global:filesystem:local")
		params := map[string]string{"path": "/data"}
		m := e.readProvider(e.alice, "room-1", "@global:filesystem:local", params, "Prefer: wait=0").problem(504, "provider-timeout")
		if m["detail"] != "Provider '@global:filesystem:local' did not respond within 0s" || m["title"] != "Gateway Timeout" {
			t.Fatalf("problem %v", m)
		}
		r := e.readProvider(e.alice, "room-1", "@global:filesystem:local", params, "Prefer: wait=0")
		r.problem(504, "provider-timeout")
		if r.Header.Get("Retry-After") != "2" {
			t.Fatalf("Retry-After %q, want 2", r.Header.Get("Retry-After"))
		}
		if n := reqs.n.Load(); n != 1 {
			t.Fatalf("%d provider_request for two identical reads, want 1 (coalescing)", n)
		}
		ev := reqs.seen[0]
		if ev.RequestID != joblib.RequestHash(params) || ev.Params != `{"path":"/data"}` || ev.ProviderName != "@global:filesystem:local" {
			t.Fatalf("provider_request %+v", ev)
		}
		// other params are another request
		e.readProvider(e.alice, "room-1", "@global:filesystem:local", map[string]string{"path": "/other"}, "Prefer: wait=0").problem(504, "provider-timeout")
		if reqs.n.Load() != 2 {
			t.Fatalf("different params did not dispatch")
		}
	})
}

func TestProviderReadNotFoundAndAuth(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		e.readProvider(e.alice, "room-1", "@global:filesystem:nope", nil).problem(404, "provider-not-found")
		e.readProvider(e.alice, "bad@room", "@global:filesystem:nope", nil).problem(400, "invalid-room-id")
		e.readProvider("", "room-1", "@global:filesystem:nope", nil).problem(401, "unauthorized")
		e.provider(e.alice, "room-42", "filesystem", "local")
		e.readProvider(e.alice, "room-99", "room-42:filesystem:local", nil, "Prefer: wait=0").problem(404, "provider-not-found")
		// query values must decode to text
		e.do(e.alice, "GET", api+"/rooms/room-42/providers/room-42:filesystem:local?path=%ff", nil).problem(422, "validation-error")
	})
}

func TestProviderReadCachedAndUpload(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		id := e.provider(e.admin, "@global", "filesystem", "local")
		reqs := countRequests(t, e.bus, "@global:filesystem:local")
		e.rec.take()
		params := map[string]string{"path": "/data"}
		e.upload(e.admin, id, joblib.RequestHash(params), []byte(`[{"name":"file.xyz","size":42}]`)).want(204)
		ready := of(e.rec.take(), "provider_result_ready")
		if len(ready) != 1 || ready[0].Room != "room:@global" {
			t.Fatalf("provider_result_ready: %v", ready)
		}
		if ev := ready[0].Event.(events.ProviderResultReady); ev.ProviderName != "@global:filesystem:local" || ev.RequestHash != joblib.RequestHash(params) {
			t.Fatalf("provider_result_ready %+v", ev)
		}
		start := time.Now()
		r := e.readProvider(e.alice, "room-1", "@global:filesystem:local", params, "Prefer: wait=5").want(200)
		if string(r.Body) != `[{"name":"file.xyz","size":42}]` || r.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("read %q (%s)", r.Body, r.Header.Get("Content-Type"))
		}
		if r.Header.Get("Preference-Applied") != "" {
			t.Fatal("a cache hit must not answer Preference-Applied")
		}
		if time.Since(start) > 2*time.Second {
			t.Fatal("a cache hit waited")
		}
		if reqs.n.Load() != 0 {
			t.Fatal("a cache hit dispatched a provider_request")
		}
		// upload errors
		e.upload(e.admin, uuid.NewString(), joblib.RequestHash(params), []byte("x")).problem(404, "provider-not-found")
		e.do(e.admin, "POST", api+"/providers/"+id+"/results", "x").problem(422, "validation-error") // no X-Request-Hash
		e.upload(e.admin, id, "not-a-hash", []byte("x")).problem(422, "validation-error")
		e.upload(e.admin, id, strings.ToUpper(joblib.RequestHash(params)), []byte("x")).problem(422, "validation-error")
		e.upload(e.admin, "nope", joblib.RequestHash(params), []byte("x")).problem(422, "validation-error")
		e.upload("", id, joblib.RequestHash(params), []byte("x")).problem(401, "unauthorized")
	})
}

func TestProviderReadBinaryAndEmpty(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		id := e.provider(e.alice, "room-1", "frames", "f", map[string]any{"content_type": "application/octet-stream"})
		bin := []byte{0, 1, 2, 0xff, 0xfe, '\n'}
		e.upload(e.alice, id, joblib.RequestHash(map[string]string{"index": "0"}), bin).want(204)
		r := e.readProvider(e.alice, "room-1", "room-1:frames:f", map[string]string{"index": "0"}).want(200)
		if !bytes.Equal(r.Body, bin) || r.Header.Get("Content-Type") != "application/octet-stream" {
			t.Fatalf("binary read %v (%s)", r.Body, r.Header.Get("Content-Type"))
		}
		e.upload(e.alice, id, joblib.RequestHash(map[string]string{}), nil).want(204)
		r = e.readProvider(e.alice, "room-1", "room-1:frames:f", nil).want(200)
		if len(r.Body) != 0 {
			t.Fatalf("empty result read as %q", r.Body)
		}
	})
}

// Query strings flatten like the Python server's: last repeated key wins,
// '+' is a space, a key without '=' has "", and the hash covers all of them.
func TestProviderReadParamsFlattening(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		id := e.provider(e.alice, "room-1", "filesystem", "local")
		want := map[string]string{"a": "2", "q": "x y", "flag": "", "ä": "/d<&>", "bad": "%zz"}
		e.upload(e.alice, id, joblib.RequestHash(want), []byte("ok")).want(204)
		r := e.do(e.alice, "GET", api+"/rooms/room-1/providers/room-1:filesystem:local?a=1&a=2&q=x+y&flag&%C3%A4=%2Fd%3C%26%3E&bad=%zz&", nil, "Prefer: wait=0")
		if r.Status != 200 || string(r.Body) != "ok" {
			t.Fatalf("flattened params did not hit the cache: %d %s", r.Status, r.Body)
		}
	})
}

func TestProviderLongPollWokenByUpload(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		id := e.provider(e.admin, "@global", "filesystem", "local")
		params := map[string]string{"path": "/data"}
		done := make(chan resp, 1)
		start := time.Now()
		go func() {
			done <- e.readProvider(e.alice, "room-1", "@global:filesystem:local", params, "Prefer: wait=5")
		}()
		waitFor(t, 5*time.Second, func() bool { return e.waiting(id, params) == 1 })
		e.upload(e.admin, id, joblib.RequestHash(params), []byte(`{"files":["a.xyz"]}`)).want(204)
		r := <-done
		r.want(200)
		if string(r.Body) != `{"files":["a.xyz"]}` || r.Header.Get("Preference-Applied") != "wait=5" {
			t.Fatalf("woken read: %s, Preference-Applied %q", r.Body, r.Header.Get("Preference-Applied"))
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("read returned after %s; the upload should wake it", d)
		}
	})
}

// Without Prefer the read waits ProviderLongPollDefault; a Prefer wait above
// ProviderLongPollMax is capped to it (the contract's min(N, max)), which the
// timeout detail and Preference-Applied report.
func TestProviderReadWaitBounds(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		e := setup(t, db, withSettings(func(s *joblib.Settings) {
			s.ProviderLongPollDefault = 300 * time.Millisecond
			s.ProviderLongPollMax = time.Second
		}))
		id := e.provider(e.alice, "room-1", "filesystem", "local")
		start := time.Now()
		m := e.readProvider(e.alice, "room-1", "room-1:filesystem:local", nil).problem(504, "provider-timeout")
		if d := time.Since(start); d < 300*time.Millisecond || d > 3*time.Second {
			t.Fatalf("default wait took %s, want about 300ms", d)
		}
		if m["detail"] != "Provider 'room-1:filesystem:local' did not respond within 0.3s" {
			t.Fatalf("detail %v", m["detail"])
		}
		start = time.Now()
		m = e.readProvider(e.alice, "room-1", "room-1:filesystem:local", nil, "Prefer: wait=3600").problem(504, "provider-timeout")
		if d := time.Since(start); d < time.Second || d > 4*time.Second {
			t.Fatalf("capped wait took %s, want about 1s", d)
		}
		if m["detail"] != "Provider 'room-1:filesystem:local' did not respond within 1s" {
			t.Fatalf("detail %v", m["detail"])
		}
		params := map[string]string{"k": "v"}
		done := make(chan resp, 1)
		go func() {
			done <- e.readProvider(e.alice, "room-1", "room-1:filesystem:local", params, "Prefer: wait=3600")
		}()
		waitFor(t, 5*time.Second, func() bool { return e.waiting(id, params) == 1 })
		e.upload(e.alice, id, joblib.RequestHash(params), []byte("v")).want(204)
		if r := (<-done).want(200); r.Header.Get("Preference-Applied") != "wait=1" {
			t.Fatalf("Preference-Applied %q, want wait=1", r.Header.Get("Preference-Applied"))
		}
	})
}

func TestProviderUploadSizeLimit(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		e := setup(t, db, withSettings(func(s *joblib.Settings) { s.ProviderMaxResultBytes = 16 }))
		id := e.provider(e.alice, "room-1", "filesystem", "local")
		h := joblib.RequestHash(map[string]string{})
		e.upload(e.alice, id, h, bytes.Repeat([]byte("x"), 17)).problem(413, "payload-too-large")
		e.readProvider(e.alice, "room-1", "room-1:filesystem:local", nil, "Prefer: wait=0").problem(504, "provider-timeout")
		e.upload(e.alice, id, h, bytes.Repeat([]byte("x"), 16)).want(204)
		e.readProvider(e.alice, "room-1", "room-1:filesystem:local", nil, "Prefer: wait=0").want(200)
	})
}

// --- test_providers.py 21–24, 28–35: delete, ownership, categories

func TestProviderDelete(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		id := e.provider(e.alice, "room-1", "filesystem", "local")
		e.rec.take()
		e.do(e.bob, "DELETE", api+"/providers/"+id, nil).problem(403, "forbidden")
		e.do(e.alice, "DELETE", api+"/providers/"+id, nil).want(204)
		if evs := of(e.rec.take(), "providers_invalidate"); len(evs) != 1 || evs[0].Room != "room:room-1" {
			t.Fatalf("providers_invalidate: %v", evs)
		}
		var p struct{ Total int }
		e.do(e.alice, "GET", api+"/rooms/room-1/providers", nil).want(200).JSON(&p)
		if p.Total != 0 {
			t.Fatal("deleted provider still listed")
		}
		e.do(e.alice, "DELETE", api+"/providers/"+id, nil).problem(404, "provider-not-found")
		e.do(e.alice, "DELETE", api+"/providers/"+uuid.NewString(), nil).problem(404, "provider-not-found")
		e.do(e.alice, "DELETE", api+"/providers/xyz", nil).problem(422, "validation-error")
		// a superuser may delete anyone's
		id = e.provider(e.alice, "room-1", "filesystem", "local")
		e.do(e.admin, "DELETE", api+"/providers/"+id, nil).want(204)
		// the deleted provider's uploads are 404 (the SDK stops on it)
		e.upload(e.alice, id, joblib.RequestHash(nil), []byte("x")).problem(404, "provider-not-found")
	})
}

func TestWorkerDeleteCascadesProviders(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		r := e.registerProvider(e.alice, "room-1", "filesystem", "local").want(201).M()
		e.rec.take()
		e.do(e.alice, "DELETE", api+"/workers/"+r["worker_id"].(string), nil).want(204)
		var p struct{ Total int }
		e.do(e.alice, "GET", api+"/rooms/room-1/providers", nil).want(200).JSON(&p)
		if p.Total != 0 {
			t.Fatal("worker deletion left its provider")
		}
		if evs := of(e.rec.take(), "providers_invalidate"); len(evs) != 1 || evs[0].Room != "room:room-1" {
			t.Fatalf("providers_invalidate: %v", evs)
		}
		e.upload(e.alice, r["id"].(string), joblib.RequestHash(nil), []byte("x")).problem(404, "provider-not-found")
	})
}

func TestProviderOwnership(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		id := e.provider(e.alice, "room-1", "filesystem", "local")
		h := joblib.RequestHash(map[string]string{})
		m := e.upload(e.bob, id, h, []byte("x")).problem(403, "forbidden")
		if m["detail"] != "Not authorized to upload results for this provider" {
			t.Fatalf("detail %v", m["detail"])
		}
		m = e.registerProvider(e.bob, "room-1", "filesystem", "local").problem(403, "forbidden")
		if m["detail"] != "Provider already registered by another user" {
			t.Fatalf("detail %v", m["detail"])
		}
		m = e.do(e.bob, "DELETE", api+"/providers/"+id, nil).problem(403, "forbidden")
		if m["detail"] != "Provider belongs to different user" {
			t.Fatalf("detail %v", m["detail"])
		}
		e.upload(e.admin, id, h, []byte("x")).want(204) // superusers may upload
		// a superuser overwrite keeps the id and transfers ownership
		over := e.registerProvider(e.admin, "room-1", "filesystem", "local").want(200).M()
		if over["id"] != id {
			t.Fatal("overwrite changed the id")
		}
		e.upload(e.alice, id, h, []byte("x")).problem(403, "forbidden")
		// the owner re-registering from a new worker moves the provider there
		id2 := e.provider(e.alice, "room-2", "filesystem", "local")
		w2 := e.do(e.alice, "POST", api+"/workers", nil).want(201).M()["id"].(string)
		moved := e.registerProvider(e.alice, "room-2", "filesystem", "local", map[string]any{"worker_id": w2}).want(200).M()
		if moved["id"] != id2 || moved["worker_id"] != w2 {
			t.Fatalf("re-registration from a new worker: %v", moved)
		}
	})
}

func TestProviderSpecialRoomsNeedSuperuser(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		m := e.registerProvider(e.alice, "@global", "filesystem", "local").problem(403, "forbidden")
		if m["detail"] != "Admin required for @global provider registration" {
			t.Fatalf("detail %v", m["detail"])
		}
		// a fix of the contract (§12.2 item 22): @internal needs a superuser too
		e.registerProvider(e.alice, "@internal", "filesystem", "local").problem(403, "forbidden")
		e.registerProvider(e.admin, "@global", "filesystem", "local").want(201)
		e.registerProvider(e.admin, "@internal", "filesystem", "local").want(201)
		// nothing half-done: alice's refused attempts created no worker
		var ws struct{ Total int }
		e.do(e.alice, "GET", api+"/workers", nil).want(200).JSON(&ws)
		if ws.Total != 2 {
			t.Fatalf("%d workers, want the 2 auto-created for admin", ws.Total)
		}
	})
}

func TestProviderCategoryAllowList(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		e := setup(t, db, withSettings(func(s *joblib.Settings) { s.AllowedProviderCategories = joblib.List{"frames"} }))
		m := e.registerProvider(e.admin, "@global", "filesystem", "local").problem(400, "invalid-category")
		if m["detail"] != "Provider category 'filesystem' not in allowed list: ['frames']" {
			t.Fatalf("detail %v", m["detail"])
		}
		st := e.svc.Settings()
		st.AllowedProviderCategories = joblib.List{"filesystem"}
		e.svc.SetSettings(st)
		e.registerProvider(e.admin, "@global", "filesystem", "local").want(201)
	})
}

// A fix of §12.2 item 24: re-registering or deleting a provider drops its
// cached results and inflight locks, so a new registration is asked afresh.
func TestProviderReregistrationPurgesCache(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		id := e.provider(e.alice, "room-1", "filesystem", "local")
		reqs := countRequests(t, e.bus, "room-1:filesystem:local")
		params := map[string]string{"path": "/"}
		e.readProvider(e.alice, "room-1", "room-1:filesystem:local", params, "Prefer: wait=0").problem(504, "provider-timeout")
		e.upload(e.alice, id, joblib.RequestHash(params), []byte("old")).want(204)
		e.readProvider(e.alice, "room-1", "room-1:filesystem:local", params).want(200)

		e.registerProvider(e.alice, "room-1", "filesystem", "local").want(200)
		e.readProvider(e.alice, "room-1", "room-1:filesystem:local", params, "Prefer: wait=0").problem(504, "provider-timeout")
		if reqs.n.Load() != 2 {
			t.Fatalf("%d dispatches, want 2: the re-registered provider must be asked again", reqs.n.Load())
		}
		// an inflight lock is dropped too: the next read after re-registration dispatches
		e.registerProvider(e.alice, "room-1", "filesystem", "local").want(200)
		e.readProvider(e.alice, "room-1", "room-1:filesystem:local", params, "Prefer: wait=0").problem(504, "provider-timeout")
		if reqs.n.Load() != 3 {
			t.Fatalf("%d dispatches, want 3", reqs.n.Load())
		}

		e.upload(e.alice, id, joblib.RequestHash(params), []byte("old")).want(204)
		e.do(e.alice, "DELETE", api+"/providers/"+id, nil).want(204)
		e.provider(e.alice, "room-1", "filesystem", "local")
		e.readProvider(e.alice, "room-1", "room-1:filesystem:local", params, "Prefer: wait=0").problem(504, "provider-timeout")
	})
}

// --- coalescing and the in-process worker

// 100 concurrent identical reads with nobody answering: exactly one
// provider_request, every reader gets 504.
func TestProviderCoalescing100(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		e.provider(e.admin, "@global", "filesystem", "local")
		reqs := countRequests(t, e.bus, "@global:filesystem:local")
		var wg sync.WaitGroup
		var timeouts atomic.Int32
		for range 100 {
			wg.Go(func() {
				r := e.readProvider(e.alice, "room-1", "@global:filesystem:local", map[string]string{"path": "/same"}, "Prefer: wait=1")
				if r.Status == 504 {
					timeouts.Add(1)
				} else {
					t.Errorf("status %d: %s", r.Status, r.Body)
				}
			})
		}
		wg.Wait()
		if timeouts.Load() != 100 || reqs.n.Load() != 1 {
			t.Fatalf("%d timeouts and %d provider_request; want 100 and exactly 1", timeouts.Load(), reqs.n.Load())
		}
	})
}

// A worker answering provider_request by uploading, while 50 readers
// long-poll the same params: all get 200 with the same bytes, one dispatch.
func TestProviderFiftyReadersOneDispatch(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		id := e.provider(e.admin, "@global", "filesystem", "local")
		w := serveProvider(t, e.bus, e.url, e.admin, id, "@global:filesystem:local", func(p map[string]string) []byte {
			time.Sleep(50 * time.Millisecond) // a provider takes a moment
			return []byte(fmt.Sprintf(`[{"name":"file.xyz","path":%q}]`, p["path"]))
		})
		var wg sync.WaitGroup
		bodies := make([]string, 50)
		for i := range 50 {
			wg.Go(func() {
				r := e.readProvider(e.alice, "room-1", "@global:filesystem:local", map[string]string{"path": "/data"}, "Prefer: wait=10")
				if r.Status != 200 {
					t.Errorf("reader %d: %d %s", i, r.Status, r.Body)
				}
				bodies[i] = string(r.Body)
			})
		}
		wg.Wait()
		for i, b := range bodies {
			if b != `[{"name":"file.xyz","path":"/data"}]` {
				t.Fatalf("reader %d got %q", i, b)
			}
		}
		if n := w.requests.Load(); n != 1 {
			t.Fatalf("%d provider_request for 50 identical readers, want 1", n)
		}
	})
}

// test_client.py 35: a read with wait=0 times out and dispatches; the
// provider's handler answers; the next read (no Prefer) is served.
func TestProviderClientRequestFlow(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		id := e.provider(e.admin, "@global", "filesystem", "local")
		// the handler runs once the first read has answered, as in the SDK test
		gate := make(chan struct{})
		w := serveProvider(t, e.bus, e.url, e.admin, id, "@global:filesystem:local", func(map[string]string) []byte {
			<-gate
			return []byte(`[{"name":"file.xyz","size":42}]`)
		})
		params := map[string]string{"path": "/"}
		e.readProvider(e.alice, "room-1", "@global:filesystem:local", params, "Prefer: wait=0").problem(504, "provider-timeout")
		close(gate)
		waitFor(t, 5*time.Second, func() bool {
			return e.readProvider(e.alice, "room-1", "@global:filesystem:local", params, "Prefer: wait=0").Status == 200
		})
		r := e.readProvider(e.alice, "room-1", "@global:filesystem:local", params).want(200)
		if string(r.Body) != `[{"name":"file.xyz","size":42}]` {
			t.Fatalf("body %s", r.Body)
		}
		if w.requests.Load() != 1 {
			t.Fatalf("%d dispatches, want 1", w.requests.Load())
		}
	})
}

// Two nodes (two Services and Servers, each with its own pool) on one
// PostgreSQL schema: a read long-polling on node A is woken by an upload
// through node B, via NOTIFY.
func TestProviderTwoNodes(t *testing.T) {
	t.Parallel()
	u := dbtest.URL(t, models.Postgres)
	node := func() *env {
		db, err := models.Open(t.Context(), u, models.OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		if _, err := db.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
		return setup(t, db)
	}
	a := node()
	b := node()
	b.admin, b.alice = a.admin, a.alice // one user table: the tokens of a work on b
	// An active content type: the answer woken by the other node's upload
	// is as inert as a local one.
	id := a.provider(a.admin, "@global", "filesystem", "local", map[string]any{"content_type": "text/html"})

	// 1. a reader on A, an upload on B, nothing else: only NOTIFY can wake A.
	params := map[string]string{"path": "/x"}
	done := make(chan resp, 1)
	go func() {
		done <- a.readProvider(a.alice, "room-1", "@global:filesystem:local", params, "Prefer: wait=20")
	}()
	waitFor(t, 5*time.Second, func() bool { return a.waiting(id, params) == 1 })
	start := time.Now()
	b.upload(b.admin, id, joblib.RequestHash(params), []byte("via b")).want(204)
	select {
	case r := <-done:
		if r.Status != 200 || string(r.Body) != "via b" {
			t.Fatalf("read on a: %d %s", r.Status, r.Body)
		}
		if h := r.Header; h.Get("X-Content-Type-Options") != "nosniff" || h.Get("Content-Security-Policy") != "sandbox" || h.Get("Content-Disposition") != "attachment" {
			t.Fatalf("read on a woken by node b: headers %v", h)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("node a woke %s after the upload on node b", d)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("read on node a was not woken by the upload on node b")
	}

	// 2. a worker that hears provider_request wherever it is dispatched (as
	//    it will once the Socket.IO layer spans nodes) uploads through the
	//    other node; 30 readers spread over both nodes, one dispatch in all.
	answer := func(p map[string]string) []byte { return []byte("answer " + p["path"]) }
	wa := serveProvider(t, a.bus, b.url, a.admin, id, "@global:filesystem:local", answer)
	wb := serveProvider(t, b.bus, a.url, a.admin, id, "@global:filesystem:local", answer)
	var wg sync.WaitGroup
	for i := range 30 {
		n := a
		if i%2 == 1 {
			n = b
		}
		wg.Go(func() {
			r := n.readProvider(n.alice, "room-1", "@global:filesystem:local", map[string]string{"path": "/y"}, "Prefer: wait=10")
			if r.Status != 200 || string(r.Body) != "answer /y" {
				t.Errorf("reader %d: %d %s", i, r.Status, r.Body)
			}
		})
	}
	wg.Wait()
	if n := wa.requests.Load() + wb.requests.Load(); n != 1 {
		t.Fatalf("%d dispatches across two nodes, want 1", n)
	}
}

// TestProviderUnstorableText: text PostgreSQL cannot store (NUL, invalid
// UTF-8) or names too long for the unique index answer 4xx, never 500, and
// store nothing.
func TestProviderUnstorableText(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		long := strings.Repeat("n", 5000)
		for _, body := range []string{
			`{"category":"files\u0000","name":"local"}`,
			`{"category":"files","name":"lo\u0000cal"}`,
			`{"category":"files","name":"` + long + `"}`,
		} {
			r := e.do(e.alice, "PUT", api+"/rooms/r1/providers", body)
			if r.Status != 422 {
				t.Errorf("register %.40q: %d %s, want 422", body, r.Status, r.Body)
			}
		}
		for _, path := range []string{
			"/rooms/r1/providers/r1:files:" + long,
			"/rooms/r1/providers/r1:files:" + long + "/info",
			"/rooms/r1/providers/r1:files:a%00b",
			"/rooms/r1/providers/r1:files:a%FFb/info",
		} {
			e.do(e.alice, "GET", api+path, nil).problem(404, "provider-not-found")
		}
		if n := e.do(e.alice, "GET", api+"/rooms/r1/providers", nil).want(200).M()["total"]; n != 0.0 {
			t.Fatalf("%v providers stored", n)
		}
	})
}
