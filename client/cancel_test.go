package client

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// cancelRun runs a handler that reports progress and then waits for its
// context, on a client of worker, and cancels its task through canceller
// (the submitter, on any node): the handler's context is done at once with
// the server's reason as its cause, and nothing is reported after it.
func cancelRun(t *testing.T, worker, canceller *testServer) {
	t.Helper()
	ctx := context.Background()
	c := dial(t, worker, WithPollInterval(time.Hour))
	if _, err := c.RegisterJob(ctx, "rc", "modifiers", "Wait", nil); err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	ended := make(chan error, 1)
	running(t, c, func(ctx context.Context, task Task) (any, error) {
		if err := task.Progress(ctx, 1, 10, "warming up"); err != nil {
			t.Errorf("progress: %v", err)
		}
		close(started)
		select {
		case <-ctx.Done():
			ended <- context.Cause(ctx)
			return nil, ctx.Err()
		case <-time.After(20 * time.Second):
			ended <- errors.New("the handler's context was never cancelled")
			return "late", nil
		}
	})
	eventually(t, "the socket joined", func() bool { return c.joinCount() == 1 })
	id := worker.submit(t, "rc", "rc:modifiers:Wait", map[string]any{})
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not start")
	}
	var seen struct {
		Status   string `json:"status"`
		Progress *struct {
			Current float64 `json:"current"`
			Message string  `json:"message"`
		} `json:"progress"`
	}
	canceller.rest(t, http.MethodGet, "/tasks/"+id, nil, nil, &seen)
	if seen.Status != "running" || seen.Progress == nil || seen.Progress.Current != 1 || seen.Progress.Message != "warming up" {
		t.Fatalf("task before the cancel: %+v", seen)
	}
	sent := time.Now()
	if st := canceller.rest(t, http.MethodPatch, "/tasks/"+id, map[string]any{"status": "cancelled"}, nil, nil); st != http.StatusOK {
		t.Fatalf("cancel: status %d", st)
	}
	select {
	case cause := <-ended:
		var ce *CancelledError
		if !errors.As(cause, &ce) || ce.TaskID != id || !strings.HasPrefix(ce.Reason, "cancelled by ") {
			t.Fatalf("handler's context cause %v", cause)
		}
		t.Logf("cancel -> handler context done: %s", time.Since(sent))
	case <-time.After(5 * time.Second):
		t.Fatal("the handler's context was not cancelled within 5s")
	}
	time.Sleep(200 * time.Millisecond) // a report would have been sent by now
	if done := worker.waitDone(t, id); done.Status != "cancelled" {
		t.Fatalf("task %s after the cancel", done.Status)
	}
}

// The submitter cancels a running task: the Go SDK's handler sees its
// context cancelled with the reason (task_cancelled on its socket).
func TestRunHandlerCancelledByServer(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		ts := startServer(t, db, 5*time.Second)
		cancelRun(t, ts, ts)
	})
}

// The same with the worker's socket on one node and the cancel sent to
// another node of the same database.
func TestRunHandlerCancelledFromAnotherNode(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t, models.Postgres)
	node := func(name string) (*models.DB, events.Bus) { return dbtest.Node(t, url, name) }
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
	dbA, busA := node("a")
	a, _ := serveNode(t, dbA, busA, 5*time.Second, listen(), "")
	dbB, busB := node("b")
	b, _ := serveNode(t, dbB, busB, 5*time.Second, listen(), a.token)
	cancelRun(t, b, a)
}
