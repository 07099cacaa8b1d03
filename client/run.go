package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Handler runs one task. Its result is stored with the completion; an error
// fails the task with the error's text.
type Handler func(ctx context.Context, t Task) (result any, err error)

// Run serves the client's jobs until ctx ends: it keeps a Socket.IO
// connection joined to each job's room (which keeps the worker's heartbeat
// fresh and brings task_available notices), claims on each notice and every
// poll interval, and runs handler for each claimed task, marking it running,
// then completed or failed. A dropped connection is re-opened with backoff
// and re-joined, so that within the server's disconnect grace the worker
// and its claimed tasks are kept. Run returns nil when ctx is cancelled; it
// does not delete the worker (see Close).
func (c *Client) Run(ctx context.Context, handler Handler) error {
	wid := c.WorkerID()
	c.mu.Lock()
	jobs := append([]string(nil), c.jobs...)
	c.mu.Unlock()
	if wid == "" || len(jobs) == 0 {
		return errors.New("run: register a job first")
	}
	wake := make(chan struct{}, 1)
	nudge := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sockDone := make(chan struct{})
	go func() {
		defer close(sockDone)
		c.keepSocket(ctx, wid, jobs, nudge)
	}()
	defer func() { <-sockDone }()

	tick := time.NewTicker(c.poll)
	defer tick.Stop()
	nudge() // tasks submitted before Run started
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-tick.C:
		}
		for ctx.Err() == nil {
			t, err := c.claimNext(ctx, wid)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				if errors.Is(err, ErrNotFound) {
					return fmt.Errorf("run: worker %s is gone: %w", wid, err)
				}
				break // transient; the next tick retries
			}
			if t == nil {
				break
			}
			c.process(ctx, handler, *t)
		}
	}
}

// claimNext claims one task over the open socket (claim_tasks, no HTTP
// request), or over REST while there is no connection or the socket call
// fails.
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
		err := s.call(sctx, "claim_tasks", map[string]any{"worker_id": wid, "limit": 1}, &ack)
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
	if _, err := c.Update(ctx, t.ID, StatusRunning, nil, ""); err != nil {
		return
	}
	res, herr := runHandler(ctx, handler, t)
	// The completion is sent even while stopping, so a finished task is not lost.
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if herr != nil {
		_, _ = c.Update(uctx, t.ID, StatusFailed, nil, herr.Error())
		return
	}
	if _, err := c.Update(uctx, t.ID, StatusCompleted, res, ""); err != nil && errors.Is(err, ErrTooLarge) {
		_, _ = c.Update(uctx, t.ID, StatusFailed, nil, "result too large: "+err.Error())
	}
}

func runHandler(ctx context.Context, h Handler, t Task) (res any, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panic: %v", r)
		}
	}()
	return h(ctx, t)
}

// keepSocket holds the connection open and joined until ctx ends.
func (c *Client) keepSocket(ctx context.Context, wid string, jobs []string, nudge func()) {
	backoff := c.backoffMin
	for ctx.Err() == nil {
		s, err := c.joinAll(ctx, wid, jobs, nudge)
		if err != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, c.backoffMax)
			continue
		}
		backoff = c.backoffMin
		c.mu.Lock()
		c.sock = s
		c.joins++
		c.mu.Unlock()
		nudge() // notices sent while disconnected were missed
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

func (c *Client) joinAll(ctx context.Context, wid string, jobs []string, nudge func()) (*socket, error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := dialSocket(dctx, c.base, c.token, func(event string, _ []json.RawMessage) {
		if event == "task_available" && !c.dropNotices {
			nudge()
		}
	})
	if err != nil {
		return nil, err
	}
	for _, j := range jobs {
		var ack struct {
			OK     bool   `json:"ok"`
			Status int    `json:"status"`
			Detail string `json:"detail"`
		}
		if err := s.call(dctx, "join_job_room", map[string]string{"job_name": j, "worker_id": wid}, &ack); err != nil {
			s.kill()
			return nil, fmt.Errorf("join %s: %w", j, err)
		}
		if !ack.OK {
			s.kill()
			return nil, fmt.Errorf("join %s: %w", j, &ProblemError{Status: ack.Status, Detail: ack.Detail})
		}
	}
	return s, nil
}
