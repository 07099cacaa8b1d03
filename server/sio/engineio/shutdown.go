package engineio

import (
	"context"
	"sync"
)

// Shutdown stops accepting sessions (503), closes every session with reason
// "server shutting down" (websocket clients see close code 1001, a pending
// poll gets a close packet) and waits until every goroutine of the server
// has exited. If ctx ends first, the remaining connections are cut without a
// close handshake, Shutdown waits for the goroutines this unblocks, and
// returns ctx's error. Safe to call more than once. It does not stop the
// http.Server the handler is mounted on.
func (srv *Server) Shutdown(ctx context.Context) error {
	srv.mu.Lock()
	srv.closed = true
	conns := make([]*Conn, 0, len(srv.sessions))
	for _, c := range srv.sessions {
		conns = append(conns, c)
	}
	srv.mu.Unlock()
	srv.tr.stop()

	for _, c := range conns {
		c.close(ReasonServerShutdown)
	}
	err := srv.tr.wait(ctx)
	if err != nil {
		for _, c := range conns {
			c.abort()
		}
		_ = srv.tr.wait(context.WithoutCancel(ctx))
	}
	return err
}

// tracker counts the server's goroutines so that Shutdown can wait for them.
type tracker struct {
	mu      sync.Mutex
	n       int
	stopped bool
	zero    chan struct{}
}

// start counts a goroutine that begins a new connection; false after stop.
func (t *tracker) start() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return false
	}
	t.addLocked()
	return true
}

// add counts a goroutine started on behalf of an existing connection.
func (t *tracker) add() {
	t.mu.Lock()
	t.addLocked()
	t.mu.Unlock()
}

func (t *tracker) addLocked() {
	if t.n == 0 {
		t.zero = make(chan struct{})
	}
	t.n++
}

func (t *tracker) done() {
	t.mu.Lock()
	t.n--
	if t.n == 0 {
		close(t.zero)
	}
	t.mu.Unlock()
}

func (t *tracker) stop() {
	t.mu.Lock()
	t.stopped = true
	t.mu.Unlock()
}

func (t *tracker) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

func (t *tracker) wait(ctx context.Context) error {
	for {
		t.mu.Lock()
		if t.n == 0 {
			t.mu.Unlock()
			return nil
		}
		zero := t.zero
		t.mu.Unlock()
		select {
		case <-zero:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
