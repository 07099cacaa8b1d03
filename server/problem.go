package server

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/zndraw/joblib/internal/clientaddr"
	"github.com/zndraw/joblib/internal/limits"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// Problem is an RFC 9457 problem details body. Every error the API answers
// has this shape and the media type application/problem+json.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// problemStatus maps each problem code to its HTTP status.
var problemStatus = map[joblib.Code]int{
	joblib.CodeJobNotFound:              http.StatusNotFound,
	joblib.CodeSchemaConflict:           http.StatusConflict,
	joblib.CodeInvalidCategory:          http.StatusBadRequest,
	joblib.CodeWorkerNotFound:           http.StatusNotFound,
	joblib.CodeTaskNotFound:             http.StatusNotFound,
	joblib.CodeInvalidTaskTransition:    http.StatusConflict,
	joblib.CodeInvalidRoomID:            http.StatusBadRequest,
	joblib.CodeForbidden:                http.StatusForbidden,
	joblib.CodeInternalJobNotConfigured: http.StatusServiceUnavailable,
	joblib.CodeProviderNotFound:         http.StatusNotFound,
	joblib.CodeProviderTimeout:          http.StatusGatewayTimeout,
	joblib.CodeValidation:               http.StatusUnprocessableEntity,
	joblib.CodePayloadTooLarge:          http.StatusRequestEntityTooLarge,
	joblib.CodeUnauthorized:             http.StatusUnauthorized,
	joblib.CodeRateLimited:              http.StatusTooManyRequests,
	joblib.CodeStatementTimeout:         http.StatusServiceUnavailable,
	joblib.CodeDatabaseUnavailable:      http.StatusServiceUnavailable,
	joblib.CodeStorageFull:              http.StatusServiceUnavailable,
	joblib.CodePolicyConflict:           http.StatusConflict,
	joblib.CodeQuotaExceeded:            http.StatusTooManyRequests,
	joblib.CodeIdempotencyKeyReused:     http.StatusUnprocessableEntity,
}

func newProblem(code joblib.Code, detail string) Problem {
	status, ok := problemStatus[code]
	if !ok {
		status = http.StatusInternalServerError
	}
	return Problem{Type: "/v1/problems/" + string(code), Title: http.StatusText(status), Status: status, Detail: detail}
}

func writeProblem(w http.ResponseWriter, p Problem) {
	if p.Status == http.StatusTooManyRequests && w.Header().Get("Retry-After") == "" {
		// Every 429 says when to come back (clients that retry wait for it).
		w.Header().Set("Retry-After", "1")
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(p.Status)
	// A problem is JSON for programs and people, not HTML: "<token>" and
	// "> threshold" stay readable.
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(p)
}

// verdict is what an error answers, over REST (a problem+json response)
// and over a socket ack alike: classify is the one place that decides it.
type verdict struct {
	Problem
	// RetryAfter is when the caller may retry (0: no Retry-After).
	RetryAfter time.Duration
	// Limit is the budget the caller ran past (counted in
	// joblib_rejections_total), "" for none.
	Limit string
	// Log is how the error is logged with the request ("" for not at all).
	Log      string
	LogLevel slog.Level
	// Gone: the caller went away (its context ended); nobody reads the
	// answer.
	Gone bool
}

// internalError is the 500 whose detail does not leak internals.
var internalError = Problem{Type: "/v1/problems/internal-error", Title: http.StatusText(500), Status: 500, Detail: "internal error"}

// classify maps err, met by work running under ctx (a request's or a
// socket event's, bounded by its database time budget), to its answer: a
// joblib.Error its problem, a database timeout, outage or full disk 503, a
// value the database refuses 422, anything else a 500 that is logged.
func classify(ctx context.Context, err error) verdict {
	if e, ok := joblib.AsError(err); ok {
		return verdict{Problem: newProblem(e.Code, e.Detail), RetryAfter: e.RetryAfter, Limit: e.Limit}
	}
	if errors.Is(err, joblib.ErrUnauthorized) {
		detail := "Unauthorized"
		var ae *joblib.AuthError
		if errors.As(err, &ae) {
			detail = ae.Reason
		}
		return verdict{Problem: newProblem(joblib.CodeUnauthorized, detail)}
	}
	if errors.Is(err, errRoomAuthUnavailable) {
		return verdict{Problem: Problem{Type: "/v1/problems/room-auth-unavailable", Title: http.StatusText(503), Status: 503,
			Detail: "Room authorization service unavailable"}, Log: "room authorization unavailable", LogLevel: slog.LevelWarn}
	}
	if errors.Is(err, errHomeNodeUnavailable) {
		return verdict{Problem: Problem{Type: "/v1/problems/node-unavailable", Title: http.StatusText(503), Status: 503,
			Detail: "the node that serves this user's claims and reports took the request and did not answer; it may have run: check the task before retrying"},
			RetryAfter: time.Second}
	}
	if errors.Is(context.Cause(ctx), errDBBudget) || (models.IsTimeout(err) && ctx.Err() == nil) {
		return classify(ctx, &joblib.Error{Code: joblib.CodeStatementTimeout, Limit: limits.StatementTimeout, RetryAfter: 5 * time.Second,
			Detail: "the request's database work took longer than its budget and was cancelled; narrow the request or retry later"})
	}
	if models.IsStorageFull(err) {
		v := classify(ctx, &joblib.Error{Code: joblib.CodeStorageFull, RetryAfter: 10 * time.Second,
			Detail: "the database is out of space; nothing of this request was stored; retry later"})
		v.Log, v.LogLevel = "the database is out of space: writes refused until space is freed", slog.LevelError
		return v
	}
	if models.IsUnavailable(err) && ctx.Err() == nil {
		v := classify(ctx, &joblib.Error{Code: joblib.CodeDatabaseUnavailable, RetryAfter: time.Second,
			Detail: "the database connection was lost; retry the request"})
		v.Log, v.LogLevel = "database connection lost under a request", slog.LevelWarn
		return v
	}
	if models.IsInvalidData(err) {
		return classify(ctx, &joblib.Error{Code: joblib.CodeValidation, Limit: limits.JSONBytes,
			Detail: "the database cannot store a value of this request (out of range or not representable)"})
	}
	if ctx.Err() != nil {
		return verdict{Problem: internalError, Gone: true}
	}
	return verdict{Problem: internalError, Log: "request failed", LogLevel: slog.LevelError}
}

// retryAfterSeconds is a Retry-After in whole seconds, rounded up (at
// least 1 when there is one).
func retryAfterSeconds(d time.Duration) int {
	if d <= 0 {
		return 0
	}
	return int(max(1, (d+time.Second-1)/time.Second))
}

// fail answers err with its problem (classify); a 500's detail does not
// leak internals (the error is logged with the request).
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	v := classify(r.Context(), err)
	if v.Limit != "" {
		s.rejections.Inc(v.Limit)
		// A budget rejection is the client's doing: at most a warning,
		// never with the payload.
		s.log.LogAttrs(r.Context(), slog.LevelDebug, "request past a budget",
			slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.String("limit", v.Limit),
			slog.String("remote", clientaddr.Of(r)))
	}
	if v.Log != "" {
		s.log.LogAttrs(r.Context(), v.LogLevel, v.Log,
			slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.String("remote", clientaddr.Of(r)), slog.Any("err", err))
	}
	if v.Gone {
		return
	}
	if n := retryAfterSeconds(v.RetryAfter); n > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(n))
	}
	writeProblem(w, v.Problem)
}

func badRequest(w http.ResponseWriter, detail string) {
	writeProblem(w, newProblem(joblib.CodeValidation, detail))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// answer writes v with status, or the problem for err.
func (s *Server) answer(w http.ResponseWriter, r *http.Request, status int, v any, err error) {
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, status, v)
}

// createdOrOK is 201 for a registration that created its row, else 200.
func createdOrOK(created bool) int {
	if created {
		return http.StatusCreated
	}
	return http.StatusOK
}

// reject answers a budget rejection the transport itself detected.
func (s *Server) reject(w http.ResponseWriter, r *http.Request, code joblib.Code, limit, detail string) {
	s.fail(w, r, &joblib.Error{Code: code, Detail: detail, Limit: limit})
}
