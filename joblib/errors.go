package joblib

import (
	"errors"
	"fmt"
	"time"
)

// Code identifies a client-facing failure. Its string is the problem type slug
// of the contract (`/v1/problems/<code>`).
type Code string

// The problem codes clients rely on.
const (
	CodeJobNotFound              Code = "job-not-found"
	CodeSchemaConflict           Code = "schema-conflict"
	CodeInvalidCategory          Code = "invalid-category"
	CodeWorkerNotFound           Code = "worker-not-found"
	CodeTaskNotFound             Code = "task-not-found"
	CodeInvalidTaskTransition    Code = "invalid-task-transition"
	CodeInvalidRoomID            Code = "invalid-room-id"
	CodeForbidden                Code = "forbidden"
	CodeInternalJobNotConfigured Code = "internal-job-not-configured"
	CodeProviderNotFound         Code = "provider-not-found"
	CodeProviderTimeout          Code = "provider-timeout"
	CodeValidation               Code = "validation-error"
	CodePayloadTooLarge          Code = "payload-too-large"
	CodeUnauthorized             Code = "unauthorized"
	// CodeRateLimited: a per-user rate or share budget is spent (429 with
	// Retry-After).
	CodeRateLimited Code = "rate-limited"
	// CodeStatementTimeout: the request's database work ran past its time
	// budget and was cancelled (503 with Retry-After).
	CodeStatementTimeout Code = "statement-timeout"
	// CodeDatabaseUnavailable: the database connection was lost under the
	// request (a terminated backend, a restart); nothing it began was
	// committed unless a commit's answer was lost (503 with Retry-After).
	CodeDatabaseUnavailable Code = "database-unavailable"
	// CodeStorageFull: the database could not write for lack of space;
	// nothing of the request was committed (503 with Retry-After).
	CodeStorageFull Code = "storage-full"
	// CodePolicyConflict: a job's worker-loss policy differs from the one its
	// creator set, and the caller may not change it.
	CodePolicyConflict Code = "policy-conflict"
	// CodeQuotaExceeded: the caller has as many workers, providers or
	// pending tasks as a per-user quota allows.
	CodeQuotaExceeded Code = "quota-exceeded"
	// CodeIdempotencyKeyReused: an Idempotency-Key repeated within its
	// window with a different request (422).
	CodeIdempotencyKeyReused Code = "idempotency-key-reused"
)

// Error is a failure the caller caused or must see, with the detail text the
// contract specifies. Everything else a Service returns is an internal error.
type Error struct {
	Code   Code
	Detail string
	// Limit names the budget a rejection enforced (the `limit` label of
	// joblib_limit_rejections_total); empty for other failures.
	Limit string
	// RetryAfter, when positive, is when the client may try again.
	RetryAfter time.Duration
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Detail }

func errf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Detail: fmt.Sprintf(format, args...)}
}

// AsError returns the *Error in err's chain, if any.
func AsError(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}

// IsCode reports whether err carries the given code.
func IsCode(err error, code Code) bool {
	e, ok := AsError(err)
	return ok && e.Code == code
}

// limitErr is a budget rejection: code and detail for the client, the
// budget's name for the metric.
func limitErr(code Code, limit string, retryAfter time.Duration, format string, args ...any) *Error {
	return &Error{Code: code, Detail: fmt.Sprintf(format, args...), Limit: limit, RetryAfter: retryAfter}
}
