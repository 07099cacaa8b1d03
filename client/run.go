package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// Handler runs one task. Its result is stored with the completion; an error
// fails the task with the error's text. Its context is cancelled, with a
// *CancelledError as the cause (context.Cause), when the server ends the
// task under it: cancelled by its submitter or an operator, or timed out;
// nothing is reported for such a task. t.Progress reports progress.
type Handler func(ctx context.Context, t Task) (result any, err error)

// CancelledError is the cause of a handler's context cancelled because the
// server ended its task (task_cancelled): Reason says why.
type CancelledError struct {
	TaskID, Reason string
}

func (e *CancelledError) Error() string {
	return fmt.Sprintf("task %s ended by the server: %s", e.TaskID, e.Reason)
}

// Run serves the client's jobs and providers until ctx ends. It keeps a
// Socket.IO connection joined to each job's and provider's room (which
// keeps the worker's heartbeat fresh and brings task_available and
// provider_request events), claims on each notice and every poll interval,
// and runs handler for each claimed task, which is running when the handler
// starts and completed or failed when it returns (over the socket while it
// is open: claim_tasks starts the task, update_tasks reports it). Provider requests are answered by their
// ProviderHandler and uploaded under the request's hash.
//
// A dropped connection is re-opened with backoff and re-joined, so that
// within the server's disconnect grace the worker and its claimed tasks are
// kept. When the server has lost the worker (it was cleaned up after a
// server restart, an outage longer than the grace, or an operator's
// delete), Run registers a new worker with the same jobs and providers and
// goes on: WorkerID changes. Run returns nil when ctx is cancelled, after
// the running handlers have returned and their outcomes were sent; it does
// not delete the worker (see Close). handler may be nil for a client that
// serves providers only.
func (c *Client) Run(ctx context.Context, handler Handler) error {
	c.mu.Lock()
	wid, njobs, nprov := c.workerID, len(c.jobs), len(c.providers)
	c.mu.Unlock()
	if wid == "" || njobs+nprov == 0 {
		return errors.New("run: register a job or a provider first")
	}
	if njobs > 0 && handler == nil {
		return errors.New("run: jobs need a handler")
	}
	rs := &runState{wake: make(chan struct{}, 1), slots: make(chan struct{}, c.provSlots)}
	ctx, cancel := context.WithCancel(ctx)
	rs.ctx = ctx
	sockDone := make(chan struct{})
	go func() {
		defer close(sockDone)
		c.keepSocket(rs)
	}()
	defer func() {
		cancel()
		<-sockDone        // no provider request arrives after this
		rs.answers.Wait() // provider handlers that started
	}()

	tick := time.NewTicker(c.poll)
	defer tick.Stop()
	rs.nudge() // tasks submitted before Run started
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-rs.wake:
		case <-tick.C:
		}
		if njobs == 0 {
			continue
		}
		for ctx.Err() == nil {
			wid := c.WorkerID()
			if wid == "" {
				return errors.New("run: the client was closed")
			}
			t, err := c.claimNext(ctx, wid)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				if errors.Is(err, ErrUnauthorized) || errors.Is(err, ErrForbidden) {
					return fmt.Errorf("run: %w", err)
				}
				if errors.Is(err, ErrNotFound) {
					// The worker is gone: register again, then claim at once.
					if rerr := c.reregister(ctx, wid); rerr != nil {
						c.log.Warn("joblib: re-registration failed", "err", rerr)
						break
					}
					continue
				}
				c.log.Warn("joblib: claim failed; retrying at the next tick", "err", err)
				break
			}
			if t == nil {
				break
			}
			c.process(ctx, handler, *t)
		}
	}
}

// runState is what one Run shares with its socket and provider goroutines.
type runState struct {
	ctx     context.Context
	wake    chan struct{}
	slots   chan struct{} // provider answers in progress
	answers sync.WaitGroup
}

func (rs *runState) nudge() {
	select {
	case rs.wake <- struct{}{}:
	default:
	}
}

// reregister restores the client's registrations after the server lost
// them; stale is the worker id found missing. When the worker itself is
// gone, a new one is created; its jobs and providers are registered again
// either way, and a socket bound to the old worker is dropped so that Run
// re-joins as the new one. Concurrent callers that saw the same stale id
// register once.
func (c *Client) reregister(ctx context.Context, stale string) error {
	c.regMu.Lock()
	defer c.regMu.Unlock()
	c.mu.Lock()
	wid, partial := c.workerID, c.partial
	jobs := append([]*jobReg(nil), c.jobs...)
	provs := append([]*providerReg(nil), c.providers...)
	c.mu.Unlock()
	if wid == "" || (wid != stale && !partial) {
		return nil // closed, or done by another caller
	}
	if !partial {
		err := c.do(ctx, http.MethodPatch, "/workers/"+url.PathEscape(wid), struct{}{}, nil)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return fmt.Errorf("re-register: %w", err)
		}
		if err != nil {
			var w struct {
				ID string `json:"id"`
			}
			if err := c.do(ctx, http.MethodPost, "/workers", struct{}{}, &w); err != nil {
				return fmt.Errorf("re-register worker: %w", err)
			}
			c.mu.Lock()
			c.workerID, c.partial = w.ID, true
			c.reregs++
			c.mu.Unlock()
			c.log.Info("joblib: the server lost the worker; registered a new one", "old", stale, "new", w.ID)
			wid = w.ID
		}
	}
	for _, j := range jobs {
		if _, err := c.putJob(ctx, wid, j); err != nil {
			return fmt.Errorf("re-register: %w", err)
		}
	}
	for _, p := range provs {
		if _, err := c.putProvider(ctx, wid, p); err != nil {
			return fmt.Errorf("re-register: %w", err)
		}
	}
	c.mu.Lock()
	c.partial = false
	s := c.sock
	c.mu.Unlock()
	if wid != stale && s != nil {
		s.kill() // re-join bound to the new worker
	}
	return nil
}

// claimNext claims one task over the open socket (claim_tasks, no HTTP
// request; the task comes back already running), or over REST while there
// is no connection or the socket call fails.
func (c *Client) claimNext(ctx context.Context, wid string) (*Task, error) {
	c.mu.Lock()
	s := c.sock
	c.mu.Unlock()
	if s != nil {
		var ack struct {
			OK     bool   `json:"ok"`
			Status int    `json:"status"`
			Detail string `json:"detail"`
			Tasks  []Task `json:"tasks"`
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := s.call(sctx, "claim_tasks", map[string]any{"worker_id": wid, "limit": 1, "start": true}, &ack)
		cancel()
		if err == nil {
			if !ack.OK {
				return nil, fmt.Errorf("claim over the socket: %w", &ProblemError{Status: ack.Status, Detail: ack.Detail})
			}
			c.mu.Lock()
			c.socketClaims++
			c.mu.Unlock()
			if len(ack.Tasks) == 0 {
				return nil, nil
			}
			return &ack.Tasks[0], nil
		}
	}
	return c.Claim(ctx)
}

// process runs one claimed task to its end. Errors updating it (a task
// cancelled meanwhile answers 409) leave it to the server.
func (c *Client) process(ctx context.Context, handler Handler, t Task) {
	if t.Status != StatusRunning { // claimed over REST (or by a server that does not start claims)
		started, err := c.Update(ctx, t.ID, StatusRunning, nil, "")
		if err != nil {
			c.log.Warn("joblib: could not start a claimed task; leaving it to the server", "task", t.ID, "err", err)
			return
		}
		// The handler gets the task as it is now: running, with its start.
		t.Status = StatusRunning
		if started != nil && started.StartedAt != nil {
			t.StartedAt = started.StartedAt
		}
	}
	t.c = c
	hctx, hcancel := context.WithCancelCause(ctx)
	c.mu.Lock()
	if c.running == nil {
		c.running = map[string]context.CancelCauseFunc{}
	}
	c.running[t.ID] = hcancel
	c.mu.Unlock()
	res, herr := runHandler(hctx, handler, t)
	c.mu.Lock()
	delete(c.running, t.ID)
	c.mu.Unlock()
	hcancel(nil)
	var ended *CancelledError
	if errors.As(context.Cause(hctx), &ended) {
		// The server ended the task: there is nothing to report.
		c.log.Info("joblib: the server ended a running task", "task", t.ID, "reason", ended.Reason)
		return
	}
	// The completion is sent even while stopping, so a finished task is not lost.
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if herr != nil {
		if err := c.report(uctx, t.ID, StatusFailed, nil, herr.Error()); err != nil {
			c.log.Warn("joblib: could not fail a task", "task", t.ID, "err", err)
		}
		return
	}
	err := c.report(uctx, t.ID, StatusCompleted, res, "")
	if err != nil && errors.Is(err, ErrTooLarge) {
		err = c.report(uctx, t.ID, StatusFailed, nil, "result too large: "+err.Error())
	}
	if err != nil {
		c.log.Warn("joblib: could not complete a task", "task", t.ID, "err", err)
	}
}

// socketReportMax bounds the results reported over the socket. A larger one
// goes over HTTP, whose limit is the server's result limit: a socket message
// past the server's (smaller) message limit would close the connection.
const socketReportMax = 64 << 10

// report sends a task's outcome over the open socket (update_tasks, no HTTP
// request), or with PATCH while there is no connection, the result is
// large, the socket call fails or the server does not know update_tasks.
// A refusal is a *ProblemError either way.
func (c *Client) report(ctx context.Context, taskID, status string, result any, errText string) error {
	c.mu.Lock()
	s := c.sock
	c.mu.Unlock()
	up := map[string]any{"task_id": taskID, "status": status}
	if errText != "" {
		up["error"] = errText
	}
	if result != nil && status == StatusCompleted {
		raw, err := json.Marshal(result)
		if err != nil || len(raw) > socketReportMax {
			s = nil
		} else {
			up["result"] = json.RawMessage(raw)
		}
	}
	if s != nil {
		var ack struct {
			OK      bool `json:"ok"`
			Results []struct {
				Problem *ProblemError `json:"problem"`
			} `json:"results"`
		}
		err := s.call(ctx, "update_tasks", map[string]any{"updates": []any{up}}, &ack)
		if err == nil && ack.OK && len(ack.Results) == 1 {
			if p := ack.Results[0].Problem; p != nil {
				return fmt.Errorf("update task %s to %s: %w", taskID, status, p)
			}
			c.mu.Lock()
			c.socketReports++
			c.mu.Unlock()
			return nil
		}
	}
	_, err := c.Update(ctx, taskID, status, result, errText)
	return err
}

func runHandler(ctx context.Context, h Handler, t Task) (res any, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panic: %v", r)
		}
	}()
	return h(ctx, t)
}

// keepSocket holds the connection open and joined until rs.ctx ends.
func (c *Client) keepSocket(rs *runState) {
	ctx := rs.ctx
	backoff := c.backoffMin
	reregistered := false // a 404 right after re-registering waits out the backoff
	for ctx.Err() == nil {
		wid := c.WorkerID()
		s, err := c.joinAll(rs, wid)
		if err != nil {
			if errors.Is(err, ErrNotFound) && !reregistered && ctx.Err() == nil {
				// The worker or one of its jobs is gone: register again and
				// join at once.
				if err = c.reregister(ctx, wid); err == nil {
					reregistered = true
					continue
				}
			}
			reregistered = false
			if errors.Is(err, ErrUnauthorized) || errors.Is(err, ErrForbidden) {
				c.log.Error("joblib: the server refuses the token", "err", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, c.backoffMax)
			continue
		}
		backoff, reregistered = c.backoffMin, false
		c.mu.Lock()
		c.sock = s
		c.joins++
		c.mu.Unlock()
		rs.nudge() // notices sent while disconnected were missed
		select {
		case <-ctx.Done():
			s.close()
		case <-s.done:
		}
		c.mu.Lock()
		c.sock = nil
		c.mu.Unlock()
	}
}

// joinAll opens a connection and joins the rooms of every job and provider
// as worker wid.
func (c *Client) joinAll(rs *runState, wid string) (*socket, error) {
	dctx, cancel := context.WithTimeout(rs.ctx, 10*time.Second)
	defer cancel()
	s, err := dialSocket(dctx, c.base, c.token, func(event string, args []json.RawMessage) {
		switch event {
		case "task_available":
			if !c.dropNotices {
				rs.nudge()
			}
		case "provider_request":
			c.onProviderRequest(rs, args)
		case "task_cancelled":
			c.onTaskCancelled(args)
		}
	})
	if err != nil {
		return nil, err
	}
	type join struct{ event, key, name string }
	var joins []join
	c.mu.Lock()
	for _, j := range c.jobs {
		joins = append(joins, join{"join_job_room", "job_name", j.room + ":" + j.category + ":" + j.name})
	}
	for _, p := range c.providers {
		joins = append(joins, join{"join_provider_room", "provider_name", p.fullName})
	}
	c.mu.Unlock()
	for _, j := range joins {
		var ack struct {
			OK     bool   `json:"ok"`
			Status int    `json:"status"`
			Detail string `json:"detail"`
		}
		if err := s.call(dctx, j.event, map[string]string{j.key: j.name, "worker_id": wid}, &ack); err != nil {
			s.kill()
			return nil, fmt.Errorf("join %s: %w", j.name, err)
		}
		if !ack.OK {
			s.kill()
			return nil, fmt.Errorf("join %s: %w", j.name, &ProblemError{Status: ack.Status, Detail: ack.Detail})
		}
	}
	return s, nil
}

// onProviderRequest starts answering a provider_request. It runs on the
// socket's read loop, so the handler runs in its own goroutine, at most
// WithProviderConcurrency at once.
func (c *Client) onProviderRequest(rs *runState, args []json.RawMessage) {
	var ev providerRequest
	if len(args) == 0 || json.Unmarshal(args[0], &ev) != nil {
		return
	}
	reg := c.provider(ev.ProviderName)
	if reg == nil {
		return
	}
	rs.answers.Add(1)
	go func() {
		defer rs.answers.Done()
		select {
		case rs.slots <- struct{}{}:
		case <-rs.ctx.Done():
			return
		}
		defer func() { <-rs.slots }()
		c.answer(rs.ctx, reg, ev)
	}()
}

// onTaskCancelled cancels the context of the handler running the task the
// server ended (cancelled or timed out).
func (c *Client) onTaskCancelled(args []json.RawMessage) {
	var ev struct {
		TaskID string `json:"task_id"`
		Reason string `json:"reason"`
	}
	if len(args) == 0 || json.Unmarshal(args[0], &ev) != nil {
		return
	}
	c.mu.Lock()
	cancel := c.running[ev.TaskID]
	c.mu.Unlock()
	if cancel != nil {
		cancel(&CancelledError{TaskID: ev.TaskID, Reason: ev.Reason})
	}
}

// progress sends a progress report over the open socket (task_progress), or
// with PATCH while there is none or the socket call fails.
func (c *Client) progress(ctx context.Context, taskID string, current, total float64, msg string) error {
	c.mu.Lock()
	s := c.sock
	c.mu.Unlock()
	body := map[string]any{"current": current, "total": total, "message": msg}
	if s != nil {
		var ack struct {
			OK     bool   `json:"ok"`
			Status int    `json:"status"`
			Detail string `json:"detail"`
		}
		err := s.call(ctx, "task_progress", map[string]any{"task_id": taskID, "current": current, "total": total, "message": msg}, &ack)
		if err == nil {
			if !ack.OK {
				return fmt.Errorf("progress of task %s: %w", taskID, &ProblemError{Status: ack.Status, Detail: ack.Detail})
			}
			return nil
		}
	}
	if err := c.do(ctx, http.MethodPatch, "/tasks/"+url.PathEscape(taskID), map[string]any{"progress": body}, nil); err != nil {
		return fmt.Errorf("progress of task %s: %w", taskID, err)
	}
	return nil
}
