package joblib

import (
	"time"

	"github.com/zndraw/joblib/models"
)

// quotaFor returns the per-user cap of a usage kind (0: unlimited).
func (st Settings) quotaFor(kind string) int {
	switch kind {
	case models.UsageWorkers:
		return st.UserMaxWorkers
	case models.UsageProviders:
		return st.UserMaxProviders
	case models.UsagePendingTasks:
		return st.UserMaxPendingTasks
	}
	return 0
}

var quotaNoun = map[string]string{
	models.UsageWorkers:      "workers",
	models.UsageProviders:    "providers",
	models.UsagePendingTasks: "pending tasks",
}

var quotaVar = map[string]string{
	models.UsageWorkers:      "JOBLIB_USER_MAX_WORKERS",
	models.UsageProviders:    "JOBLIB_USER_MAX_PROVIDERS",
	models.UsagePendingTasks: "JOBLIB_USER_MAX_PENDING_TASKS",
}

// quotaRetryAfter is the Retry-After of a quota refusal: the user's own
// items must finish or go first, which takes longer than a rate's refill.
const quotaRetryAfter = 5 * time.Second

// checkQuota refuses (429 quota-exceeded) one more item of kind for p when p
// already has `extra`+cap of them counted (extra = 1 when the new item is
// already inserted in this transaction, else 0). Superusers are exempt. The
// user row lock makes concurrent creations of one user count exactly.
func (s *Service) checkQuota(q *models.Q, p Principal, kind string, inserted bool) error {
	if inserted {
		return s.checkQuotaAdd(q, p, kind, 0)
	}
	return s.checkQuotaAdd(q, p, kind, 1)
}

// checkQuotaAdd refuses (429 quota-exceeded) adding n items of kind when p
// would then have more than its cap (n = 0: the new item is already
// counted, and p must not be past the cap with it). The refusal is whole:
// a batch that does not fit adds nothing.
func (s *Service) checkQuotaAdd(q *models.Q, p Principal, kind string, n int) error {
	limit := s.Settings().quotaFor(kind)
	bounded := kind == models.UsagePendingTasks && n > 0
	if limit <= 0 || p.Superuser {
		if bounded {
			// Pending tasks that no quota counted: the bound no longer holds.
			return q.ForgetPendingBound(p.ID)
		}
		return nil
	}
	if err := q.LockUser(p.ID); err != nil {
		return err
	}
	if bounded {
		// Room below the quota in the bound: the tasks fit, nothing to count.
		b, ok, err := q.PendingBound(p.ID)
		if err != nil {
			return err
		}
		if ok && b+int64(n) <= int64(limit) {
			return q.SetPendingBound(p.ID, b+int64(n))
		}
	}
	have, err := q.CountUsage(p.ID, kind, limit+1)
	if err != nil {
		return err
	}
	if n == 0 {
		have--
		n = 1
	}
	if have+int64(n) > int64(limit) {
		if n > 1 {
			return limitErr(CodeQuotaExceeded, "", quotaRetryAfter, "Quota exceeded: user '%s' has %d %s and may have %d (%s=%d); none of the %d was added",
				p.Name, min(have, int64(limit)), quotaNoun[kind], limit, quotaVar[kind], limit, n)
		}
		return limitErr(CodeQuotaExceeded, "", quotaRetryAfter, "Quota exceeded: user '%s' already has %d %s (%s=%d)", p.Name, limit, quotaNoun[kind], quotaVar[kind], limit)
	}
	if bounded {
		// have is exact here (below the limit it counted up to).
		return q.SetPendingBound(p.ID, have+int64(n))
	}
	return nil
}
