package client

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinels matched by a *ProblemError with errors.Is, by HTTP status.
var (
	ErrUnauthorized = errors.New("unauthorized")      // 401
	ErrForbidden    = errors.New("forbidden")         // 403
	ErrNotFound     = errors.New("not found")         // 404
	ErrConflict     = errors.New("conflict")          // 409 (schema-conflict, invalid-task-transition)
	ErrTooLarge     = errors.New("payload too large") // 413
	ErrValidation   = errors.New("validation error")  // 422
	ErrRateLimited  = errors.New("rate limited")      // 429; see ProblemError.RetryAfter
	ErrUnavailable  = errors.New("unavailable")       // 503
	// ErrProviderTimeout: a provider read nobody answered in time (504);
	// ProblemError.RetryAfter says when to read again.
	ErrProviderTimeout = errors.New("provider timeout")
)

// ProblemError is an RFC 9457 problem answered by the server.
type ProblemError struct {
	Type       string        `json:"type"` // e.g. "/v1/problems/task-not-found"
	Title      string        `json:"title"`
	Status     int           `json:"status"`
	Detail     string        `json:"detail"`
	RetryAfter time.Duration `json:"-"` // from the Retry-After header, 0 without one
}

func (e *ProblemError) Error() string {
	return fmt.Sprintf("%d %s: %s", e.Status, e.Slug(), e.Detail)
}

// Slug is the problem type's last segment, e.g. "task-not-found".
func (e *ProblemError) Slug() string {
	return e.Type[strings.LastIndexByte(e.Type, '/')+1:]
}

// Is matches the sentinel of the problem's status.
func (e *ProblemError) Is(target error) bool {
	switch e.Status {
	case 401:
		return target == ErrUnauthorized
	case 403:
		return target == ErrForbidden
	case 404:
		return target == ErrNotFound
	case 409:
		return target == ErrConflict
	case 413:
		return target == ErrTooLarge
	case 422:
		return target == ErrValidation
	case 429:
		return target == ErrRateLimited
	case 503:
		return target == ErrUnavailable
	case 504:
		return target == ErrProviderTimeout
	}
	return false
}
