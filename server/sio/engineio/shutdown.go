package engineio

import (
	"context"
	"sync/atomic"
	"time"
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

// tracker counts the server's goroutines so that Shutdown can wait for
// them. It is an atomic counter: a broadcast starts a writer for every
// member, and a mutex here would make them all queue on it.
type tracker struct {
	n       atomic.Int64
	stopped atomic.Bool
}

// start counts a goroutine that begins a new connection; false after stop.
func (t *tracker) start() bool {
	if t.stopped.Load() {
		return false
	}
	t.n.Add(1)
	if t.stopped.Load() {
		t.n.Add(-1)
		return false
	}
	return true
}

// add counts a goroutine started on behalf of an existing connection.
func (t *tracker) add() { t.n.Add(1) }

func (t *tracker) done() { t.n.Add(-1) }

func (t *tracker) stop() { t.stopped.Store(true) }

func (t *tracker) count() int { return int(t.n.Load()) }

// wait polls until no goroutine is counted or ctx ends.
func (t *tracker) wait(ctx context.Context) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for t.n.Load() > 0 {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
