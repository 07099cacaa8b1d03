package server_test

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/zndraw/joblib/joblib"
)

// Per-user quotas on workers, providers and pending tasks answer 429
// quota-exceeded past the cap, free up as items go, and do not apply to
// superusers.
func TestUserQuotas(t *testing.T) {
	t.Parallel()
	opts := []func(*setupOpts){withSettings(func(s *joblib.Settings) {
		s.UserMaxWorkers, s.UserMaxProviders, s.UserMaxPendingTasks = 3, 1, 2
	})}
	eachWith(t, opts, func(t *testing.T, e *env) {
		ws := []string{}
		for range 3 {
			ws = append(ws, e.do(e.alice, "POST", api+"/workers", nil).want(201).M()["id"].(string))
		}
		p := e.do(e.alice, "POST", api+"/workers", nil).problem(http.StatusTooManyRequests, "quota-exceeded")
		if p["detail"] != "Quota exceeded: user 'alice' already has 3 workers (JOBLIB_USER_MAX_WORKERS=3)" {
			t.Fatalf("detail %v", p["detail"])
		}
		// Registrations that would create a worker count too.
		e.do(e.alice, "PUT", api+"/rooms/room/jobs", map[string]any{"category": "modifiers", "name": "J"}).problem(429, "quota-exceeded")
		e.registerProvider(e.alice, "room", "data", "P").problem(429, "quota-exceeded")
		e.do(e.alice, "DELETE", api+"/workers/"+ws[2], nil).want(204)
		ws[2] = e.do(e.alice, "POST", api+"/workers", nil).want(201).M()["id"].(string)

		e.registerJob(e.alice, "room", "modifiers", "J", map[string]any{"worker_id": ws[0]})
		e.registerProvider(e.alice, "room", "data", "P", map[string]any{"worker_id": ws[0]}).want(201)
		e.registerProvider(e.alice, "room", "data", "Q", map[string]any{"worker_id": ws[0]}).problem(429, "quota-exceeded")
		e.registerProvider(e.alice, "room", "data", "P", map[string]any{"worker_id": ws[1]}).want(200) // an update is not a new one

		a := e.submit(e.alice, "room", "room:modifiers:J", nil)
		e.submit(e.alice, "room", "room:modifiers:J", nil)
		e.do(e.alice, "POST", api+"/rooms/room/tasks/room:modifiers:J", map[string]any{"payload": map[string]any{}}).problem(429, "quota-exceeded")
		e.submit(e.bob, "room", "room:modifiers:J", nil) // quotas are per user
		e.patch(e.alice, a, "cancelled").want(200)
		e.submit(e.alice, "room", "room:modifiers:J", nil)
		if n := e.total(api + "/rooms/room/tasks?status=pending"); n != 3 {
			t.Fatalf("%d pending", n)
		}

		for range 5 {
			e.do(e.admin, "POST", api+"/workers", nil).want(201)
		}
		for range 3 {
			e.submit(e.admin, "room", "room:modifiers:J", nil)
		}
	})
}

// Concurrent creations of one user are counted exactly: of many parallel
// POST /workers exactly the quota succeed.
func TestUserQuotaUnderConcurrency(t *testing.T) {
	t.Parallel()
	const quota, tries = 4, 16
	opts := []func(*setupOpts){withSettings(func(s *joblib.Settings) { s.UserMaxWorkers = quota })}
	eachWith(t, opts, func(t *testing.T, e *env) {
		var mu sync.Mutex
		got := map[int]int{}
		var wg sync.WaitGroup
		for range tries {
			wg.Go(func() {
				req, _ := http.NewRequestWithContext(context.Background(), "POST", e.url+api+"/workers", nil)
				req.Header.Set("Authorization", "Bearer "+e.bob)
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				res.Body.Close()
				mu.Lock()
				got[res.StatusCode]++
				mu.Unlock()
			})
		}
		wg.Wait()
		if got[201] != quota || got[429] != tries-quota {
			t.Fatalf("answers %v, want %d created and %d refused", got, quota, tries-quota)
		}
		if n := e.total(api + "/workers"); n != quota {
			t.Fatalf("%d workers", n)
		}
	})
}
