package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Task statuses a worker sets with Update.
const (
	StatusRunning   = "running"
	StatusCompleted = "completed"
	StatusFailed    = "failed"
)

// Task is a task as the server returns it.
type Task struct {
	ID          string          `json:"id"`
	JobName     string          `json:"job_name"`
	RoomID      string          `json:"room_id"`
	Status      string          `json:"status"`
	WorkerID    *string         `json:"worker_id"`
	Error       *string         `json:"error"`
	Payload     json.RawMessage `json:"payload"`
	Result      json.RawMessage `json:"result,omitempty"`
	Attempt     int             `json:"attempt"`
	CreatedAt   time.Time       `json:"created_at"`
	StartedAt   *time.Time      `json:"started_at"`
	CompletedAt *time.Time      `json:"completed_at"`
	// DeadlineAt is when the server times the task out unless it finishes
	// (or, under a heartbeat_timeout, reports progress) first; nil: no
	// limit.
	DeadlineAt *time.Time `json:"deadline_at,omitempty"`

	// c reports progress for a task handed to a Handler by Run.
	c *Client
}

// Progress reports the task's progress (current of total, and a message) to
// the server, which shows it to the room's UIs and counts the task's
// heartbeat_timeout again from now. It is sent over Run's open socket, or
// with PATCH while there is none. Available on the tasks Run hands to a
// Handler. A task that ended meanwhile (cancelled, timed out) answers a
// *ProblemError matching ErrConflict.
func (t Task) Progress(ctx context.Context, current, total float64, msg string) error {
	if t.c == nil {
		return errors.New("progress: only a task handed to a Handler by Run can report progress")
	}
	return t.c.progress(ctx, t.ID, current, total, msg)
}

// Job is a registered job.
type Job struct {
	ID       string          `json:"id"`
	RoomID   string          `json:"room_id"`
	Category string          `json:"category"`
	Name     string          `json:"name"`
	FullName string          `json:"full_name"`
	Schema   json.RawMessage `json:"schema"`
	WorkerID *string         `json:"worker_id"`
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient sets the HTTP client used for REST calls.
func WithHTTPClient(h *http.Client) Option { return func(c *Client) { c.http = h } }

// WithPollInterval sets how often Run claims when no task_available
// notice arrived (the polling fallback). Default 5 s.
func WithPollInterval(d time.Duration) Option { return func(c *Client) { c.poll = d } }

// WithReconnectBackoff sets the first and the largest delay between socket
// reconnection attempts. Defaults 100 ms and 2 s; keep the largest well under
// the server's disconnect grace.
func WithReconnectBackoff(min, max time.Duration) Option {
	return func(c *Client) { c.backoffMin, c.backoffMax = min, max }
}

// WithLogger sets where Run reports what it cannot return: a failed
// update or upload, a provider handler's error, a re-registration.
// Default slog.Default().
func WithLogger(l *slog.Logger) Option { return func(c *Client) { c.log = l } }

// WithProviderConcurrency sets how many provider requests Run answers at
// once (default 4); more wait for a free slot.
func WithProviderConcurrency(n int) Option { return func(c *Client) { c.provSlots = max(n, 1) } }

// Client talks to one joblib server as one worker.
type Client struct {
	base       string // e.g. http://host:8000 (no trailing slash)
	token      string
	http       *http.Client
	poll       time.Duration
	backoffMin time.Duration
	backoffMax time.Duration

	log       *slog.Logger
	provSlots int // provider requests answered at once

	regMu sync.Mutex // serialises re-registration

	mu        sync.Mutex
	workerID  string
	jobs      []*jobReg      // registered by this client, in order
	providers []*providerReg // registered by this client, in order
	sock      *socket        // Run's open connection, nil between connections
	joins     int            // connections Run opened and joined
	// Set while a new worker exists whose jobs and providers are not all
	// registered yet: re-registration resumes instead of making another.
	partial bool
	reregs  int // workers re-created after the server lost one

	socketClaims int // claims answered over the socket
	// socketReports counts outcomes reported over the socket.
	socketReports int

	dropNotices bool // tests: ignore task_available, leaving only the polling fallback

	// running: task id -> cancels its handler's context (task_cancelled).
	running map[string]context.CancelCauseFunc

	// sleep waits between two attempts of a submission (tests record it).
	sleep func(ctx context.Context, d time.Duration) error
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Dial checks that the server at baseURL answers and accepts token, and
// returns a Client. It does not register a worker: see RegisterWorker.
func Dial(ctx context.Context, baseURL, token string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("dial %q: want an http(s) URL", baseURL)
	}
	c := &Client{
		base: strings.TrimRight(baseURL, "/"), token: token, http: http.DefaultClient,
		poll: 5 * time.Second, backoffMin: 100 * time.Millisecond, backoffMax: 2 * time.Second,
		log: slog.Default(), provSlots: 4, sleep: sleepCtx,
	}
	for _, o := range opts {
		o(c)
	}
	// A cheap authenticated read: a bad token fails here, not at the first claim.
	if err := c.do(ctx, http.MethodGet, "/workers?limit=0", nil, nil); err != nil {
		return nil, fmt.Errorf("dial %s: %w", c.base, err)
	}
	return c, nil
}

// WorkerID is the id of the worker registered by RegisterWorker or
// RegisterJob ("" before).
func (c *Client) WorkerID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.workerID
}

// RegisterWorker creates a worker owned by the token's user and makes it the
// client's worker. It returns its id.
func (c *Client) RegisterWorker(ctx context.Context) (string, error) {
	var w struct {
		ID string `json:"id"`
	}
	if err := c.do(ctx, http.MethodPost, "/workers", struct{}{}, &w); err != nil {
		return "", fmt.Errorf("register worker: %w", err)
	}
	c.mu.Lock()
	c.workerID = w.ID
	c.mu.Unlock()
	return w.ID, nil
}

// jobReg is a job as the client registered it, kept to register it again.
type jobReg struct {
	room, category, name string
	schema               any
}

// RegisterJob registers the job room:category:name served by the client's
// worker (registering a worker first when there is none). schema may be nil.
func (c *Client) RegisterJob(ctx context.Context, room, category, name string, schema any) (*Job, error) {
	wid, err := c.ensureWorker(ctx)
	if err != nil {
		return nil, fmt.Errorf("register job %s:%s:%s: %w", room, category, name, err)
	}
	if schema == nil {
		schema = map[string]any{}
	}
	reg := &jobReg{room: room, category: category, name: name, schema: schema}
	j, err := c.putJob(ctx, wid, reg)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.jobs = append(c.jobs, reg)
	c.mu.Unlock()
	return j, nil
}

func (c *Client) putJob(ctx context.Context, wid string, reg *jobReg) (*Job, error) {
	body := map[string]any{"category": reg.category, "name": reg.name, "schema": reg.schema, "worker_id": wid}
	var j Job
	if err := c.do(ctx, http.MethodPut, "/rooms/"+url.PathEscape(reg.room)+"/jobs", body, &j); err != nil {
		return nil, fmt.Errorf("register job %s:%s:%s: %w", reg.room, reg.category, reg.name, err)
	}
	return &j, nil
}

// ensureWorker returns the client's worker, registering one when there is none.
func (c *Client) ensureWorker(ctx context.Context) (string, error) {
	if wid := c.WorkerID(); wid != "" {
		return wid, nil
	}
	return c.RegisterWorker(ctx)
}

// Claim claims the oldest pending task of the worker's jobs; nil, nil when
// there is none.
func (c *Client) Claim(ctx context.Context) (*Task, error) {
	wid := c.WorkerID()
	if wid == "" {
		return nil, errors.New("claim: no worker registered")
	}
	var out struct {
		Task *Task `json:"task"`
	}
	if err := c.do(ctx, http.MethodPost, "/tasks/claim", map[string]string{"worker_id": wid}, &out); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	return out.Task, nil
}

// Update moves a claimed task to status (StatusRunning, StatusCompleted or
// StatusFailed). result is stored with StatusCompleted; errText with
// StatusFailed.
func (c *Client) Update(ctx context.Context, taskID, status string, result any, errText string) (*Task, error) {
	body := map[string]any{"status": status}
	if result != nil && status == StatusCompleted {
		body["result"] = result
	}
	if errText != "" {
		body["error"] = errText
	}
	var t Task
	if err := c.do(ctx, http.MethodPatch, "/tasks/"+url.PathEscape(taskID), body, &t); err != nil {
		return nil, fmt.Errorf("update task %s to %s: %w", taskID, status, err)
	}
	return &t, nil
}

// Task reads one task.
func (c *Client) Task(ctx context.Context, taskID string) (*Task, error) {
	var t Task
	if err := c.do(ctx, http.MethodGet, "/tasks/"+url.PathEscape(taskID), nil, &t); err != nil {
		return nil, fmt.Errorf("get task %s: %w", taskID, err)
	}
	return &t, nil
}

// Heartbeat refreshes the worker's heartbeat over REST. A worker whose
// socket is open (Run) does not need it: the socket binding keeps it fresh.
func (c *Client) Heartbeat(ctx context.Context) error {
	wid := c.WorkerID()
	if wid == "" {
		return errors.New("heartbeat: no worker registered")
	}
	if err := c.do(ctx, http.MethodPatch, "/workers/"+url.PathEscape(wid), struct{}{}, nil); err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	return nil
}

// Close deletes the worker (the graceful cleanup: its jobs lose it, its
// claimed tasks are handled like a lost worker's). A worker already gone is
// not an error.
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	wid := c.workerID
	c.workerID = ""
	c.mu.Unlock()
	if wid == "" {
		return nil
	}
	err := c.do(ctx, http.MethodDelete, "/workers/"+url.PathEscape(wid), nil, nil)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("delete worker %s: %w", wid, err)
	}
	return nil
}

// do sends a REST request under /v1/joblib with a JSON body (when not nil)
// and decodes a 2xx JSON answer into out (when not nil); other answers
// become a *ProblemError.
func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	hdr := http.Header{}
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode body: %w", err)
		}
		rd = bytes.NewReader(b)
		hdr.Set("Content-Type", "application/json")
	}
	data, _, err := c.send(ctx, method, path, hdr, rd)
	if err != nil || out == nil || len(data) == 0 {
		return err
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decode answer: %w", err)
	}
	return nil
}

// send sends a REST request under /v1/joblib and returns a 2xx answer's
// body and headers; other answers become a *ProblemError.
func (c *Client) send(ctx context.Context, method, path string, hdr http.Header, body io.Reader) ([]byte, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+"/v1/joblib"+path, body)
	if err != nil {
		return nil, nil, fmt.Errorf("build request: %w", err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	res, err := c.http.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		return nil, nil, fmt.Errorf("read answer: %w", err)
	}
	if res.StatusCode/100 != 2 {
		return nil, nil, problemFrom(res, data)
	}
	return data, res.Header, nil
}

func problemFrom(res *http.Response, data []byte) *ProblemError {
	p := &ProblemError{Status: res.StatusCode}
	_ = json.Unmarshal(data, p) // a non-JSON answer keeps only the status
	p.Status = res.StatusCode
	if p.Detail == "" && p.Type == "" {
		p.Detail = strings.TrimSpace(string(data))
	}
	if ra := res.Header.Get("Retry-After"); ra != "" {
		if s, err := strconv.Atoi(ra); err == nil {
			p.RetryAfter = time.Duration(s) * time.Second
		}
	}
	return p
}
