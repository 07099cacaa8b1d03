// Package limits names joblib's budgets and counts their rejections in one
// Prometheus counter, joblib_limit_rejections_total{limit}, shared by every
// layer that enforces a budget (REST, domain, Socket.IO).
package limits

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The budgets' names: the values of the `limit` label. Keep the set small
// and fixed (labels must stay bounded).
const (
	BodyBytes            = "body_bytes"             // JOBLIB_MAX_BODY_BYTES
	JSONDepth            = "json_depth"             // JOBLIB_MAX_JSON_DEPTH
	JSONBytes            = "json_bytes"             // invalid UTF-8, NUL, out-of-range numbers
	ListOffset           = "list_offset"            // JOBLIB_MAX_LIST_OFFSET
	StatementTimeout     = "statement_timeout"      // JOBLIB_READ_DB_TIMEOUT, JOBLIB_WRITE_DB_TIMEOUT
	SubmitRate           = "submit_rate"            // JOBLIB_SUBMIT_RATE
	ProviderDispatchRate = "provider_dispatch_rate" // JOBLIB_PROVIDER_DISPATCH_RATE
	InternalRate         = "internal_rate"          // JOBLIB_INTERNAL_RATE
	InternalQueueShare   = "internal_queue_share"   // JOBLIB_INTERNAL_QUEUE_PER_USER
	ProviderResultBytes  = "provider_result_bytes"  // JOBLIB_PROVIDER_MAX_RESULT_BYTES and the per-provider share
	RoomAuthRate         = "room_auth_rate"         // JOBLIB_ROOM_AUTH_RATE: uncached room questions per client address
	SessionLookups       = "session_lookups"        // unknown socket session ids looked up per client address
	AuthFailures         = "auth_failures"          // JOBLIB_AUTH_FAILURE_RATE: refused credentials per client address
)

// Names lists the budgets known here, so that their series exist at zero
// from the start. Another layer may count names of its own too.
var Names = []string{BodyBytes, JSONDepth, JSONBytes, ListOffset, StatementTimeout, SubmitRate,
	ProviderDispatchRate, InternalRate, InternalQueueShare, ProviderResultBytes, RoomAuthRate, SessionLookups, AuthFailures}

// Rejections counts budget rejections by limit. The zero value and a nil
// pointer are usable and count nothing, so code paths without metrics (tests,
// tools) need no guard.
type Rejections struct {
	vec *prometheus.CounterVec
}

// NewRejections creates the counter; register it (it is a
// prometheus.Collector) with the process's registry.
func NewRejections() *Rejections {
	r := &Rejections{vec: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "joblib_limit_rejections_total",
		Help: "Requests, messages or connections refused because they exceeded a budget, by budget.",
	}, []string{"limit"})}
	for _, n := range Names {
		r.vec.WithLabelValues(n)
	}
	return r
}

// Inc counts one rejection by the named budget.
func (r *Rejections) Inc(limit string) {
	if r == nil || r.vec == nil || limit == "" {
		return
	}
	r.vec.WithLabelValues(limit).Inc()
}

// Value is the count for one budget (for tests).
func (r *Rejections) Value(limit string) float64 {
	if r == nil || r.vec == nil {
		return 0
	}
	var m dto.Metric
	_ = r.vec.WithLabelValues(limit).Write(&m)
	return m.GetCounter().GetValue()
}

// Describe implements prometheus.Collector.
func (r *Rejections) Describe(ch chan<- *prometheus.Desc) { r.vec.Describe(ch) }

// Collect implements prometheus.Collector.
func (r *Rejections) Collect(ch chan<- prometheus.Metric) { r.vec.Collect(ch) }
