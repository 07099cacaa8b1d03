package server_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"

	"github.com/zndraw/joblib/internal/limits"
	"github.com/zndraw/joblib/joblib"
)

// wantRetryAfter checks a 429 rate-limited problem with a positive
// Retry-After.
func wantRateLimited(t *testing.T, r resp) {
	t.Helper()
	r.problem(429, "rate-limited")
	if n, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || n < 1 {
		t.Fatalf("Retry-After %q", r.Header.Get("Retry-After"))
	}
}

// Task submission is rate limited per user (JOBLIB_SUBMIT_RATE/_BURST): past
// the burst a user gets 429 with Retry-After and nothing is stored, while
// another user's submissions (and a superuser's) still succeed.
func TestSubmitRateLimit(t *testing.T) {
	t.Parallel()
	opts := []func(*setupOpts){withSettings(func(s *joblib.Settings) { s.SubmitRate, s.SubmitBurst = 0.001, 3 })}
	eachWith(t, opts, func(t *testing.T, e *env) {
		e.registerJob(e.admin, "@global", "modifiers", "Open")
		job := "@global:modifiers:Open"
		for range 3 {
			e.submit(e.bob, "room", job, nil)
		}
		before := e.api.Rejections().Value(limits.SubmitRate)
		wantRateLimited(t, e.do(e.bob, "POST", api+"/rooms/room/tasks/"+job, map[string]any{"payload": map[string]any{}}))
		if e.api.Rejections().Value(limits.SubmitRate) != before+1 {
			t.Fatal("rejection not counted")
		}
		e.submit(e.alice, "room", job, nil)
		for range 5 {
			e.submit(e.admin, "room", job, nil)
		}
		if n := e.total(api + "/rooms/room/tasks"); n != 3+1+5 {
			t.Fatalf("%d tasks stored, want 9", n)
		}
	})
}

// Provider reads that dispatch a provider_request are rate limited per
// reader (JOBLIB_PROVIDER_DISPATCH_RATE/_BURST): user B reading user A's
// provider with ever new params gets 429 past the burst and A's socket sees
// no more requests than the burst; cached reads are not limited.
func TestProviderDispatchRateLimit(t *testing.T) {
	t.Parallel()
	opts := []func(*setupOpts){withSettings(func(s *joblib.Settings) { s.ProviderDispatchRate, s.ProviderDispatchBurst = 0.001, 2 })}
	eachWith(t, opts, func(t *testing.T, e *env) {
		pid := e.provider(e.alice, "room", "filesystem", "files")
		full := "room:filesystem:files"
		reqs := countRequests(t, e.bus, full)
		for i := range 2 {
			e.readProvider(e.bob, "room", full, map[string]string{"i": strconv.Itoa(i)}, "Prefer: wait=0").want(504)
		}
		for i := 2; i < 10; i++ {
			wantRateLimited(t, e.readProvider(e.bob, "room", full, map[string]string{"i": strconv.Itoa(i)}, "Prefer: wait=0"))
		}
		if n := reqs.n.Load(); n != 2 {
			t.Fatalf("%d provider_request dispatched, want 2", n)
		}
		// A refused read left no inflight lock: once answered, the same
		// params read from cache without a token.
		hash := joblib.RequestHash(map[string]string{"i": "0"})
		e.upload(e.alice, pid, hash, []byte(`{"ok":1}`)).want(204)
		for range 5 {
			e.readProvider(e.bob, "room", full, map[string]string{"i": "0"}).want(200)
		}
		// Another reader has a budget of its own.
		e.readProvider(e.alice, "room", full, map[string]string{"i": "x"}, "Prefer: wait=0").want(504)
		if v := e.api.Rejections().Value(limits.ProviderDispatchRate); v != 8 {
			t.Fatalf("rejections{provider_dispatch_rate} = %v, want 8", v)
		}
	})
}

// The @internal executor gives each user a share of its queue
// (JOBLIB_INTERNAL_QUEUE_PER_USER): one user holding its share gets 429
// (nothing stored) and cannot make another user's submission fail; and
// @internal submissions have their own rate (JOBLIB_INTERNAL_RATE).
func TestInternalQueueShare(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	block := internalJob("Block", func(ctx context.Context, _ joblib.InternalTask) (json.RawMessage, error) {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return json.RawMessage(`{}`), nil
	})
	opts := []func(*setupOpts){withInternal(block), withSettings(func(s *joblib.Settings) {
		s.InternalWorkers, s.InternalQueue, s.InternalQueuePerUser = 1, 3, 2
	})}
	eachWith(t, opts, func(t *testing.T, e *env) {
		defer func() {
			for range 4 {
				select {
				case release <- struct{}{}:
				default:
				}
			}
		}()
		full := "@internal:modifiers:Block"
		submit := func(tok string) resp {
			return e.do(tok, "POST", api+"/rooms/room/tasks/"+full, map[string]any{"payload": map[string]any{}})
		}
		// Bob's share is 2 (one running, one queued).
		for range 2 {
			if st := submit(e.bob).want(202).M()["status"]; st == "failed" {
				t.Fatal("bob's submission within his share failed")
			}
		}
		for range 5 {
			wantRateLimited(t, submit(e.bob))
		}
		// Alice's submission still finds a slot.
		if m := submit(e.alice).want(202).M(); m["status"] == "failed" {
			t.Fatalf("alice's submission failed while bob held his share: %v", m)
		}
		if n := e.total(api + "/rooms/room/tasks"); n != 3 {
			t.Fatalf("%d tasks stored, want 3", n)
		}
		if v := e.api.Rejections().Value(limits.InternalQueueShare); v != 5 {
			t.Fatalf("rejections{internal_queue_share} = %v, want 5", v)
		}
	})
}

func TestInternalRateLimit(t *testing.T) {
	t.Parallel()
	noop := internalJob("Noop", func(context.Context, joblib.InternalTask) (json.RawMessage, error) { return nil, nil })
	opts := []func(*setupOpts){withInternal(noop), withSettings(func(s *joblib.Settings) { s.InternalRate, s.InternalBurst = 0.001, 4 })}
	eachWith(t, opts, func(t *testing.T, e *env) {
		full := "@internal:modifiers:Noop"
		for i := range 4 {
			e.do(e.bob, "POST", api+"/rooms/room/tasks/"+full, map[string]any{"payload": map[string]any{"i": i}}).want(202)
		}
		wantRateLimited(t, e.do(e.bob, "POST", api+"/rooms/room/tasks/"+full, map[string]any{"payload": map[string]any{}}))
		// Regular submissions are not spent by @internal ones.
		e.registerJob(e.admin, "@global", "modifiers", "Open")
		e.submit(e.bob, "room", "@global:modifiers:Open", nil)
	})
}
