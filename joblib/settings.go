package joblib

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/zndraw/joblib/models"
)

// Settings are the coordinator's behaviour knobs (the contract's §9). Read
// from JOBLIB_-prefixed environment variables by cmd/joblib; the field tags
// name them and give their defaults.
type Settings struct {
	// WorkerTimeout: a worker whose last heartbeat is older than this (by the
	// database's clock) is stale and gets cleaned up by the sweeper.
	WorkerTimeout time.Duration `env:"WORKER_TIMEOUT" envDefault:"60s"`
	// SweeperInterval is the period of the stale-worker sweep.
	SweeperInterval time.Duration `env:"SWEEPER_INTERVAL" envDefault:"30s"`
	// InternalTaskTimeout fails @internal tasks claimed or running for longer.
	InternalTaskTimeout time.Duration `env:"INTERNAL_TASK_TIMEOUT" envDefault:"1h"`
	// LongPollMaxWait caps `Prefer: wait=N` on GET /tasks/{id}.
	LongPollMaxWait time.Duration `env:"LONG_POLL_MAX_WAIT" envDefault:"60s"`
	// AllowedCategories are the job categories registration accepts.
	AllowedCategories List `env:"ALLOWED_CATEGORIES" envDefault:"modifiers,selections,analysis"`
	// AllowedProviderCategories restricts provider categories; empty allows any.
	AllowedProviderCategories List `env:"ALLOWED_PROVIDER_CATEGORIES"`
	// ProviderResultTTL is how long an uploaded provider result is served from cache.
	ProviderResultTTL time.Duration `env:"PROVIDER_RESULT_TTL" envDefault:"5m"`
	// ProviderInflightTTL is how long a dispatched provider request suppresses
	// identical dispatches while no result arrives.
	ProviderInflightTTL time.Duration `env:"PROVIDER_INFLIGHT_TTL" envDefault:"30s"`
	// ProviderLongPollDefault is a provider read's wait without a Prefer header.
	ProviderLongPollDefault time.Duration `env:"PROVIDER_LONG_POLL_DEFAULT" envDefault:"5s"`
	// ProviderLongPollMax caps a provider read's `Prefer: wait=N`.
	ProviderLongPollMax time.Duration `env:"PROVIDER_LONG_POLL_MAX" envDefault:"30s"`
	// ProviderMaxResultBytes caps one uploaded provider result; a larger
	// upload answers 413 and stores nothing.
	ProviderMaxResultBytes int64 `env:"PROVIDER_MAX_RESULT_BYTES" envDefault:"16777216"`
	// ProviderCacheBytes caps the provider result cache's total size; a
	// store past it evicts the least recently used results.
	ProviderCacheBytes int64 `env:"PROVIDER_CACHE_BYTES" envDefault:"134217728"`
	// ProviderCacheEntries caps the number of cached provider results.
	ProviderCacheEntries int64 `env:"PROVIDER_CACHE_ENTRIES" envDefault:"10000"`
	// ProviderCacheShare is the fraction of both caps one provider may hold;
	// its own least recently used results are evicted first, and a single
	// result larger than its share answers 413.
	ProviderCacheShare float64 `env:"PROVIDER_CACHE_SHARE" envDefault:"0.25"`
	// SubmitRate is how many submissions (a batch is one) per second one
	// user may make (token bucket of SubmitBurst, per node); past it a
	// submission answers 429 with Retry-After. Superusers are not limited.
	// 0 disables it. The default is above what one node answers a
	// sequential client (about 500/s), so only concurrent floods meet it.
	SubmitRate  float64 `env:"SUBMIT_RATE" envDefault:"1000"`
	SubmitBurst int     `env:"SUBMIT_BURST" envDefault:"20000"`
	// MaxSubmitBatch caps the tasks of one batch submission; a larger batch
	// answers 422 and stores nothing.
	MaxSubmitBatch int `env:"MAX_SUBMIT_BATCH" envDefault:"1000"`
	// IdempotencyWindow is how long an Idempotency-Key of a submission is
	// remembered (database clock); a repeat within it gets the first
	// answer. Older keys are deleted by the retention pass.
	IdempotencyWindow time.Duration `env:"IDEMPOTENCY_WINDOW" envDefault:"24h"`
	// ProviderDispatchRate is how many provider reads per second one user may
	// make that dispatch a provider_request (cache misses not already in
	// flight); past it 429. Superusers are not limited. 0 disables it.
	ProviderDispatchRate  float64 `env:"PROVIDER_DISPATCH_RATE" envDefault:"100"`
	ProviderDispatchBurst int     `env:"PROVIDER_DISPATCH_BURST" envDefault:"1000"`
	// InternalRate is how many @internal tasks per second one user may
	// submit; past it 429. Superusers are not limited. 0 disables it.
	InternalRate  float64 `env:"INTERNAL_RATE" envDefault:"5"`
	InternalBurst int     `env:"INTERNAL_BURST" envDefault:"32"`
	// InternalQueuePerUser is how many @internal tasks of one user may be
	// queued or running at once, so that one user cannot fill the executor
	// and make another's submission fail; past it 429, nothing stored.
	InternalQueuePerUser int `env:"INTERNAL_QUEUE_PER_USER" envDefault:"64"`
	// TaskMaxResultBytes caps the `result` a worker reports with a task's
	// completion (PATCH /tasks/{id}); a larger one answers 413 and changes
	// nothing.
	TaskMaxResultBytes int64 `env:"TASK_MAX_RESULT_BYTES" envDefault:"1048576"`
	// TaskProgressRate is how many task_progress_event per second one task
	// sends its room at most (per node); reports in between are coalesced,
	// the latest value kept.
	TaskProgressRate float64 `env:"TASK_PROGRESS_RATE" envDefault:"4"`
	// InternalWorkers is how many @internal tasks run at once inside the server.
	InternalWorkers int `env:"INTERNAL_WORKERS" envDefault:"4"`
	// InternalQueue is how many @internal tasks may wait for a worker; a
	// submission beyond it fails at once ("Failed to dispatch to internal
	// executor") rather than blocking the request.
	InternalQueue int `env:"INTERNAL_QUEUE" envDefault:"256"`

	// NodeID names this process among the nodes sharing a database; workers
	// whose socket it holds are bound to it. Empty means the hostname plus a
	// random part, unique per process. Read once at start. Two running
	// processes never share one: a process whose JOBLIB_NODE_ID another live
	// process holds refuses to start.
	NodeID string `env:"NODE_ID"`
	// NodeLeaseTimeout: each node renews a lease row (database clock) every
	// third of this; when a node's lease lapses, the sweeper leader treats
	// every socket it held as closed at that moment (the disconnect grace
	// starts, then CleanupWorker with path node).
	NodeLeaseTimeout time.Duration `env:"NODE_LEASE_TIMEOUT" envDefault:"10s"`
	// SweepBatchSize is how many stale workers one sweep transaction cleans
	// (1..1000); a sweep runs batches until none is left.
	SweepBatchSize int `env:"SWEEP_BATCH_SIZE" envDefault:"500"`
	// SweepMaxFraction caps a sweep's blast radius: when more than this
	// fraction of all workers is stale (and more than SweepCapMinWorkers),
	// the sweep records what it would do and alerts instead of acting.
	// 0 disables the cap.
	SweepMaxFraction float64 `env:"SWEEP_MAX_FRACTION" envDefault:"0"`
	// SweepCapMinWorkers: the cap never holds back a sweep of at most this
	// many workers.
	SweepCapMinWorkers int `env:"SWEEP_CAP_MIN_WORKERS" envDefault:"10"`
	// AuditRetention is how long cleanup_events and audit_log rows are kept;
	// the sweeper deletes older ones. 0 keeps them forever.
	AuditRetention time.Duration `env:"AUDIT_RETENTION" envDefault:"720h"`

	// TaskRetentionCompleted is how long completed and cancelled tasks are
	// kept after they finished (database clock); the sweeper deletes older
	// ones in batches. 0 keeps them forever.
	TaskRetentionCompleted time.Duration `env:"TASK_RETENTION_COMPLETED" envDefault:"24h"`
	// TaskRetentionFailed is the same for failed tasks. 0 keeps them.
	TaskRetentionFailed time.Duration `env:"TASK_RETENTION_FAILED" envDefault:"168h"`
	// TaskRetentionBatch is how many tasks one retention statement deletes
	// (1..10000); a pass runs at most taskPruneMaxBatches of them.
	TaskRetentionBatch int `env:"TASK_RETENTION_BATCH" envDefault:"1000"`
	// Per-user quotas (0 = unlimited; superusers are exempt): past them a
	// creation answers 429 quota-exceeded.
	UserMaxWorkers      int `env:"USER_MAX_WORKERS" envDefault:"1000"`
	UserMaxProviders    int `env:"USER_MAX_PROVIDERS" envDefault:"1000"`
	UserMaxPendingTasks int `env:"USER_MAX_PENDING_TASKS" envDefault:"100000"`
	// NotifyAfterCommit (PostgreSQL) sends events to other nodes with a
	// NOTIFY of their own after the change commits, as joblib used to:
	// at-most-once across a crash between the two. By default the change's
	// own statement or transaction writes them to the event outbox and the
	// relay NOTIFYs the committed rows (sent once the change committed,
	// never without it), without the commit serialisation a NOTIFY inside
	// the change would cause (see BENCHMARKS.md).
	NotifyAfterCommit bool `env:"NOTIFY_AFTER_COMMIT" envDefault:"false"`
	// GroupCommitDelay (PostgreSQL) is how long a claim or status report
	// that would go to the database alone waits for others of its kind (of
	// any user) to share its statement, while such calls are already
	// sharing statements (see groupCommit). 0 sends lone calls at once.
	GroupCommitDelay time.Duration `env:"GROUP_COMMIT_DELAY" envDefault:"300us"`
}

// DefaultSettings returns the documented defaults.
func DefaultSettings() Settings {
	return Settings{
		WorkerTimeout:           60 * time.Second,
		SweeperInterval:         30 * time.Second,
		InternalTaskTimeout:     time.Hour,
		LongPollMaxWait:         60 * time.Second,
		AllowedCategories:       List{"modifiers", "selections", "analysis"},
		ProviderResultTTL:       5 * time.Minute,
		ProviderInflightTTL:     30 * time.Second,
		ProviderLongPollDefault: 5 * time.Second,
		ProviderLongPollMax:     30 * time.Second,
		ProviderMaxResultBytes:  16 << 20,
		ProviderCacheBytes:      128 << 20,
		ProviderCacheEntries:    10000,
		ProviderCacheShare:      0.25,
		SubmitRate:              1000,
		SubmitBurst:             20000,
		MaxSubmitBatch:          1000,
		IdempotencyWindow:       24 * time.Hour,
		ProviderDispatchRate:    100,
		ProviderDispatchBurst:   1000,
		InternalRate:            5,
		InternalBurst:           32,
		InternalQueuePerUser:    64,
		TaskMaxResultBytes:      1 << 20,
		TaskProgressRate:        4,
		InternalWorkers:         4,
		InternalQueue:           256,
		NodeLeaseTimeout:        10 * time.Second,
		SweepBatchSize:          500,
		SweepCapMinWorkers:      10,
		AuditRetention:          720 * time.Hour,
		GroupCommitDelay:        300 * time.Microsecond,
		TaskRetentionCompleted:  24 * time.Hour,
		TaskRetentionFailed:     168 * time.Hour,
		TaskRetentionBatch:      1000,
		UserMaxWorkers:          1000,
		UserMaxProviders:        1000,
		UserMaxPendingTasks:     100000,
	}
}

// Validate rejects settings the coordinator cannot run with.
func (s Settings) Validate() error {
	for name, d := range map[string]time.Duration{
		"JOBLIB_WORKER_TIMEOUT": s.WorkerTimeout, "JOBLIB_SWEEPER_INTERVAL": s.SweeperInterval,
		"JOBLIB_INTERNAL_TASK_TIMEOUT": s.InternalTaskTimeout, "JOBLIB_PROVIDER_RESULT_TTL": s.ProviderResultTTL,
		"JOBLIB_PROVIDER_INFLIGHT_TTL": s.ProviderInflightTTL, "JOBLIB_NODE_LEASE_TIMEOUT": s.NodeLeaseTimeout,
	} {
		if d <= 0 {
			return fmt.Errorf("%s must be positive, got %s", name, d)
		}
	}
	for name, d := range map[string]time.Duration{
		"JOBLIB_LONG_POLL_MAX_WAIT": s.LongPollMaxWait, "JOBLIB_PROVIDER_LONG_POLL_DEFAULT": s.ProviderLongPollDefault,
		"JOBLIB_PROVIDER_LONG_POLL_MAX": s.ProviderLongPollMax,
	} {
		if d < 0 {
			return fmt.Errorf("%s must not be negative, got %s", name, d)
		}
	}
	if s.ProviderMaxResultBytes <= 0 {
		return fmt.Errorf("JOBLIB_PROVIDER_MAX_RESULT_BYTES must be positive, got %d", s.ProviderMaxResultBytes)
	}
	if s.GroupCommitDelay < 0 || s.GroupCommitDelay >= sharedWindow {
		return fmt.Errorf("JOBLIB_GROUP_COMMIT_DELAY must be at least 0 and below %s, got %s", sharedWindow, s.GroupCommitDelay)
	}
	if s.ProviderCacheBytes <= 0 || s.ProviderCacheEntries <= 0 {
		return fmt.Errorf("JOBLIB_PROVIDER_CACHE_BYTES and JOBLIB_PROVIDER_CACHE_ENTRIES must be positive, got %d and %d", s.ProviderCacheBytes, s.ProviderCacheEntries)
	}
	if s.ProviderCacheShare <= 0 || s.ProviderCacheShare > 1 {
		return fmt.Errorf("JOBLIB_PROVIDER_CACHE_SHARE must be above 0 and at most 1, got %g", s.ProviderCacheShare)
	}
	if s.TaskProgressRate <= 0 {
		return fmt.Errorf("JOBLIB_TASK_PROGRESS_RATE must be positive, got %g", s.TaskProgressRate)
	}
	if s.TaskMaxResultBytes <= 0 {
		return fmt.Errorf("JOBLIB_TASK_MAX_RESULT_BYTES must be positive, got %d", s.TaskMaxResultBytes)
	}
	if s.InternalWorkers <= 0 {
		return fmt.Errorf("JOBLIB_INTERNAL_WORKERS must be positive, got %d", s.InternalWorkers)
	}
	if s.SubmitRate < 0 || s.ProviderDispatchRate < 0 || s.InternalRate < 0 || s.InternalQueuePerUser < 0 {
		return fmt.Errorf("JOBLIB_SUBMIT_RATE, JOBLIB_PROVIDER_DISPATCH_RATE, JOBLIB_INTERNAL_RATE and JOBLIB_INTERNAL_QUEUE_PER_USER must not be negative")
	}
	if s.MaxSubmitBatch < 1 || s.MaxSubmitBatch > models.MaxTaskBatch {
		return fmt.Errorf("JOBLIB_MAX_SUBMIT_BATCH must be between 1 and %d, got %d", models.MaxTaskBatch, s.MaxSubmitBatch)
	}
	if s.IdempotencyWindow <= 0 {
		return fmt.Errorf("JOBLIB_IDEMPOTENCY_WINDOW must be positive, got %s", s.IdempotencyWindow)
	}
	if s.InternalQueue < 0 {
		return fmt.Errorf("JOBLIB_INTERNAL_QUEUE must not be negative, got %d", s.InternalQueue)
	}
	if s.SweepBatchSize < 1 || s.SweepBatchSize > models.MaxCleanupBatch {
		return fmt.Errorf("JOBLIB_SWEEP_BATCH_SIZE must be between 1 and %d, got %d", models.MaxCleanupBatch, s.SweepBatchSize)
	}
	if s.SweepMaxFraction < 0 || s.SweepMaxFraction > 1 {
		return fmt.Errorf("JOBLIB_SWEEP_MAX_FRACTION must be between 0 and 1, got %g", s.SweepMaxFraction)
	}
	if s.SweepCapMinWorkers < 0 {
		return fmt.Errorf("JOBLIB_SWEEP_CAP_MIN_WORKERS must not be negative, got %d", s.SweepCapMinWorkers)
	}
	if s.AuditRetention < 0 {
		return fmt.Errorf("JOBLIB_AUDIT_RETENTION must not be negative, got %s", s.AuditRetention)
	}
	if s.TaskRetentionCompleted < 0 {
		return fmt.Errorf("JOBLIB_TASK_RETENTION_COMPLETED must not be negative, got %s", s.TaskRetentionCompleted)
	}
	if s.TaskRetentionFailed < 0 {
		return fmt.Errorf("JOBLIB_TASK_RETENTION_FAILED must not be negative, got %s", s.TaskRetentionFailed)
	}
	if s.TaskRetentionBatch < 1 || s.TaskRetentionBatch > models.MaxPruneBatch {
		return fmt.Errorf("JOBLIB_TASK_RETENTION_BATCH must be between 1 and %d, got %d", models.MaxPruneBatch, s.TaskRetentionBatch)
	}
	if s.UserMaxWorkers < 0 || s.UserMaxProviders < 0 || s.UserMaxPendingTasks < 0 {
		return fmt.Errorf("JOBLIB_USER_MAX_WORKERS, JOBLIB_USER_MAX_PROVIDERS and JOBLIB_USER_MAX_PENDING_TASKS must not be negative (0 = unlimited)")
	}
	if len(s.AllowedCategories) == 0 {
		return fmt.Errorf("JOBLIB_ALLOWED_CATEGORIES must name at least one category")
	}
	return nil
}

// ResultCacheBudget is the provider result cache's budget.
func (s Settings) ResultCacheBudget() ResultCacheBudget {
	return ResultCacheBudget{MaxBytes: s.ProviderCacheBytes, MaxEntries: s.ProviderCacheEntries, ProviderShare: s.ProviderCacheShare}
}

// List is a list of names read from the environment either as a comma
// separated list (`a,b`) or as a JSON array (`["a","b"]`, the format the
// Python server used).
type List []string

// UnmarshalText implements encoding.TextUnmarshaler.
func (l *List) UnmarshalText(b []byte) error {
	s := strings.TrimSpace(string(b))
	if strings.HasPrefix(s, "[") {
		var v []string
		if err := json.Unmarshal([]byte(s), &v); err != nil {
			return fmt.Errorf("must be a comma-separated list such as modifiers,analysis or a JSON list of strings such as [\"modifiers\",\"analysis\"]")
		}
		*l = v
		return nil
	}
	*l = nil
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			*l = append(*l, part)
		}
	}
	return nil
}

// Contains reports whether v is in the list.
func (l List) Contains(v string) bool { return slices.Contains(l, v) }

// pyList renders the list the way the contract's error details show it.
func (l List) pyList() string {
	q := make([]string, len(l))
	for i, v := range l {
		q[i] = "'" + v + "'"
	}
	return "[" + strings.Join(q, ", ") + "]"
}
