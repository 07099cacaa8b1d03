package joblib

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
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
	}
}

// Validate rejects settings the coordinator cannot run with.
func (s Settings) Validate() error {
	for name, d := range map[string]time.Duration{
		"JOBLIB_WORKER_TIMEOUT": s.WorkerTimeout, "JOBLIB_SWEEPER_INTERVAL": s.SweeperInterval,
		"JOBLIB_INTERNAL_TASK_TIMEOUT": s.InternalTaskTimeout, "JOBLIB_PROVIDER_RESULT_TTL": s.ProviderResultTTL,
		"JOBLIB_PROVIDER_INFLIGHT_TTL": s.ProviderInflightTTL,
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
	if len(s.AllowedCategories) == 0 {
		return fmt.Errorf("JOBLIB_ALLOWED_CATEGORIES must name at least one category")
	}
	return nil
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
			return fmt.Errorf("parse list %q: %w", s, err)
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
