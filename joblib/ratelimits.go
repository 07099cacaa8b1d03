package joblib

import (
	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/ratelimit"
)

// rateLimits are the per-user token buckets on the operations that make
// the server push work to somebody else's socket or a shared pool. They
// are in memory, per node: with several nodes a user may spend each node's
// budget. Superusers (operators, trusted workers) are not limited.
type rateLimits struct {
	submit   *ratelimit.Limiter[uuid.UUID]
	dispatch *ratelimit.Limiter[uuid.UUID]
	internal *ratelimit.Limiter[uuid.UUID]
}

func newRateLimits(st Settings) rateLimits {
	return rateLimits{
		submit:   ratelimit.New[uuid.UUID](st.SubmitRate, st.SubmitBurst),
		dispatch: ratelimit.New[uuid.UUID](st.ProviderDispatchRate, st.ProviderDispatchBurst),
		internal: ratelimit.New[uuid.UUID](st.InternalRate, st.InternalBurst),
	}
}

// allow takes a token of p's bucket in l, or returns the 429 problem.
func allow(l *ratelimit.Limiter[uuid.UUID], p Principal, limit, what string) error {
	if p.Superuser {
		return nil
	}
	if ok, wait := l.Allow(p.ID); !ok {
		return limitErr(CodeRateLimited, limit, wait, "too many %s; retry after the time in Retry-After", what)
	}
	return nil
}
