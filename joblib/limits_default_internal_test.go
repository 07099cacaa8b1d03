package joblib

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/ratelimit"
	"github.com/zndraw/joblib/models"
)

// replay runs n requests of one user through the limiter l with the given
// settings on an injected clock, each arriving when the previous one was
// answered (every gap long), and returns how many were refused.
func replay(st Settings, pick func(rateLimits) *ratelimit.Limiter[uuid.UUID], n int, gap time.Duration) int {
	now := time.Unix(1_700_000_000, 0)
	rl := newRateLimits(st)
	l := pick(rl).WithClock(func() time.Time { return now })
	p := Principal{ID: uuid.New(), Name: "ui"}
	refused := 0
	for range n {
		if err := allow(l, p, "test", "requests"); err != nil {
			refused++
		}
		now = now.Add(gap)
	}
	return refused
}

func submitLimiter(r rateLimits) *ratelimit.Limiter[uuid.UUID]   { return r.submit }
func dispatchLimiter(r rateLimits) *ratelimit.Limiter[uuid.UUID] { return r.dispatch }

// The default limits refuse no well-behaved client (issue 30), replayed on
// the limiters' own clock so that minutes of load take milliseconds:
//   - a sequential loop of single submits as fast as joblib answers: 2 ms
//     per submit as measured, and 10× faster (0.2 ms), for 30,000 and
//     10,000 submits;
//   - 10,000 tasks in batches of 1,000 (one request each) at 50 ms and 5 ms
//     per batch;
//   - a UI playing a trajectory at 30 frames per second, every frame new
//     (each read dispatches), for five minutes;
//   - 50,000 pending tasks of one user fit the pending quota.
//
// The same replays with the former defaults (100/s burst 1,000; 20/s burst
// 200; 10,000 pending) are refused, so the replay can tell.
func TestDefaultLimitsRefuseNoWellBehavedClient(t *testing.T) {
	t.Parallel()
	loads := []struct {
		name  string
		pick  func(rateLimits) *ratelimit.Limiter[uuid.UUID]
		n     int
		gap   time.Duration
		wasOK bool // the former defaults let it through too
	}{
		{"sequential submits at 2ms", submitLimiter, 30_000, 2 * time.Millisecond, false},
		{"sequential submits at 0.2ms", submitLimiter, 10_000, 200 * time.Microsecond, false},
		{"batches of 1000 at 50ms", submitLimiter, 10, 50 * time.Millisecond, true},
		{"batches of 1000 at 5ms", submitLimiter, 10, 5 * time.Millisecond, true},
		{"5 min of 30 fps provider reads", dispatchLimiter, 5 * 60 * 30, time.Second / 30, false},
	}
	def := DefaultSettings()
	old := DefaultSettings()
	old.SubmitRate, old.SubmitBurst, old.ProviderDispatchRate, old.ProviderDispatchBurst, old.UserMaxPendingTasks = 100, 1000, 20, 200, 10_000
	for _, ld := range loads {
		if r := replay(def, ld.pick, ld.n, ld.gap); r != 0 {
			t.Errorf("%s: %d of %d refused with the defaults", ld.name, r, ld.n)
		}
		if r := replay(old, ld.pick, ld.n, ld.gap); (r == 0) != ld.wasOK {
			t.Errorf("%s: %d of %d refused with the former defaults; the replay does not tell", ld.name, r, ld.n)
		}
	}
	if q := def.quotaFor(models.UsagePendingTasks); q != 0 && q < 50_000+10_000 {
		t.Errorf("pending quota %d: 50,000 pending tasks and a fan-out of 10,000 do not fit", q)
	}
	if def.MaxSubmitBatch < 1000 {
		t.Errorf("JOBLIB_MAX_SUBMIT_BATCH %d below 1,000", def.MaxSubmitBatch)
	}
}
