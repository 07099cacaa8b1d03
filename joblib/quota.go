package joblib

import (
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

// checkQuota refuses (429 quota-exceeded) one more item of kind for p when p
// already has `extra`+cap of them counted (extra = 1 when the new item is
// already inserted in this transaction, else 0). Superusers are exempt. The
// user row lock makes concurrent creations of one user count exactly.
func (s *Service) checkQuota(q *models.Q, p Principal, kind string, inserted bool) error {
	limit := s.Settings().quotaFor(kind)
	if limit <= 0 || p.Superuser {
		return nil
	}
	if err := q.LockUser(p.ID); err != nil {
		return err
	}
	n, err := q.CountUsage(p.ID, kind, limit+1)
	if err != nil {
		return err
	}
	if inserted {
		n--
	}
	if n >= int64(limit) {
		return errf(CodeQuotaExceeded, "Quota exceeded: user '%s' already has %d %s (%s=%d)", p.Name, limit, quotaNoun[kind], quotaVar[kind], limit)
	}
	return nil
}
