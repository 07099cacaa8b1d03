package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// SubmitOption tunes one Submit or SubmitBatch call.
type SubmitOption func(*submitOpts)

type submitOpts struct {
	key      string
	attempts int
	maxWait  time.Duration
}

// WithIdempotencyKey sends key as the submission's Idempotency-Key instead
// of a random one: a repeat of the call (by this or another process) within
// the server's idempotency window gets the task the first one created.
func WithIdempotencyKey(key string) SubmitOption { return func(o *submitOpts) { o.key = key } }

// WithSubmitAttempts sets how many times a submission is sent at most
// (default 5; 1 sends it once and never retries).
func WithSubmitAttempts(n int) SubmitOption { return func(o *submitOpts) { o.attempts = max(n, 1) } }

// WithMaxRetryWait caps one wait between two attempts (default 60s): an
// answer asking for a longer Retry-After is returned as it is.
func WithMaxRetryWait(d time.Duration) SubmitOption { return func(o *submitOpts) { o.maxWait = d } }

// Submitted is a submission's answer.
type Submitted struct {
	// Tasks are the tasks created, in the order of the payloads.
	Tasks []Task
	// Replayed is true when the server answered a repeat of an earlier
	// request with the same Idempotency-Key (Idempotent-Replayed).
	Replayed bool
}

// Submit creates a task of the job fullName in room with payload (nil sends
// {}). Every attempt carries one Idempotency-Key (random unless
// WithIdempotencyKey gives one), so a retry never creates a second task:
// after a transport error, a 429 or a 503 it waits for the answer's
// Retry-After (or a backoff without one) and sends the same request again.
func (c *Client) Submit(ctx context.Context, room, fullName string, payload any, opts ...SubmitOption) (*Task, bool, error) {
	if payload == nil {
		payload = map[string]any{}
	}
	path := "/rooms/" + url.PathEscape(room) + "/tasks/" + escapeFullName(fullName)
	var t Task
	replayed, err := c.submit(ctx, path, map[string]any{"payload": payload}, &t, opts)
	if err != nil {
		return nil, false, err
	}
	return &t, replayed, nil
}

// SubmitBatch creates one task per payload of the job fullName in room in
// one request and one transaction (all or none), with Submit's retries;
// the key covers the whole batch.
func (c *Client) SubmitBatch(ctx context.Context, room, fullName string, payloads []any, opts ...SubmitOption) (Submitted, error) {
	items := make([]map[string]any, len(payloads))
	for i, p := range payloads {
		if p == nil {
			p = map[string]any{}
		}
		items[i] = map[string]any{"payload": p}
	}
	path := "/rooms/" + url.PathEscape(room) + "/tasks/" + escapeFullName(fullName) + "/batch"
	var out struct {
		Tasks []Task `json:"tasks"`
	}
	replayed, err := c.submit(ctx, path, map[string]any{"tasks": items}, &out, opts)
	if err != nil {
		return Submitted{}, err
	}
	return Submitted{Tasks: out.Tasks, Replayed: replayed}, nil
}

// escapeFullName escapes a job's full name for a path, keeping its colons.
func escapeFullName(full string) string { return (&url.URL{Path: full}).EscapedPath() }

// submit posts body to path under one Idempotency-Key, retrying as Submit
// describes, and decodes the 2xx answer into out.
func (c *Client) submit(ctx context.Context, path string, body, out any, opts []SubmitOption) (bool, error) {
	o := submitOpts{attempts: 5, maxWait: time.Minute}
	for _, f := range opts {
		f(&o)
	}
	if o.key == "" {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return false, fmt.Errorf("idempotency key: %w", err)
		}
		o.key = hex.EncodeToString(b[:])
	}
	data, err := json.Marshal(body)
	if err != nil {
		return false, fmt.Errorf("encode body: %w", err)
	}
	hdr := http.Header{}
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Idempotency-Key", o.key)
	backoff := max(c.backoffMin, 100*time.Millisecond)
	for attempt := 1; ; attempt++ {
		ans, h, err := c.send(ctx, http.MethodPost, path, hdr, bytes.NewReader(data))
		if err == nil {
			if err := json.Unmarshal(ans, out); err != nil {
				return false, fmt.Errorf("decode answer: %w", err)
			}
			return h.Get("Idempotent-Replayed") == "true", nil
		}
		wait, retry := retryWait(err, backoff)
		if !retry || attempt >= o.attempts || wait > o.maxWait || ctx.Err() != nil {
			return false, err
		}
		c.log.Debug("joblib: submission retried", "path", path, "attempt", attempt, "wait", wait, "err", err)
		if err := c.sleep(ctx, wait); err != nil {
			return false, err
		}
		backoff = min(2*backoff, max(c.backoffMax, backoff))
	}
}

// retryWait says whether a failed submission may be sent again and after
// how long: the answer's Retry-After for 429 and 503, a backoff after a
// transport error (the request may or may not have arrived: the key makes
// the repeat safe). Other answers are final.
func retryWait(err error, backoff time.Duration) (time.Duration, bool) {
	var pe *ProblemError
	if !errors.As(err, &pe) {
		return backoff, true
	}
	if pe.Status != http.StatusTooManyRequests && pe.Status != http.StatusServiceUnavailable {
		return 0, false
	}
	if pe.RetryAfter > 0 {
		return pe.RetryAfter, true
	}
	return backoff, true
}
