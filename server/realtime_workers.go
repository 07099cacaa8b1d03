package server

// Worker binding: a worker joins over its socket and is bound to it; when
// the socket goes away its claims are kept for the disconnect grace window.

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/server/sio"
)

// DropWorkerSockets closes every socket that holds a worker on this node, so
// that those workers reconnect and join again. Used when this node's lease
// was taken away: another node has released (cleaned) its workers.
func (rt *Realtime) DropWorkerSockets() int {
	rt.mu.Lock()
	socks := make(map[*sio.Socket]bool, len(rt.bound))
	for _, s := range rt.bound {
		socks[s] = true
	}
	rt.mu.Unlock()
	for s := range socks {
		s.Disconnect()
	}
	return len(socks)
}

// joinAsWorker authorizes a worker's join (the worker is the caller's, the
// target exists), joins the room and binds the worker to this socket.
func (rt *Realtime) joinAsWorker(ctx context.Context, s *sio.Socket, st *connState, rawWorker, room string, exists func() error) ack {
	if st.anon {
		return problemAck(joblib.CodeUnauthorized, "Unauthorized")
	}
	wid, err := uuid.Parse(rawWorker)
	if err != nil {
		return problemAck(joblib.CodeValidation, "worker_id must be a UUID")
	}
	if err := rt.svc.CheckWorker(ctx, st.p, wid); err != nil {
		return rt.errAck(ctx, err)
	}
	if err := exists(); err != nil {
		return rt.errAck(ctx, err)
	}
	st.mu.Lock()
	_, already := st.workers[wid]
	st.mu.Unlock()
	if !already {
		// Ownership was checked above; a worker deleted since is not found.
		epoch, err := rt.svc.BindWorker(ctx, wid)
		if err != nil {
			return rt.errAck(ctx, err)
		}
		st.mu.Lock()
		st.workers[wid] = epoch
		st.mu.Unlock()
		rt.mu.Lock()
		if t := rt.graces[wid]; t != nil {
			t.Stop()
			delete(rt.graces, wid)
		}
		rt.bound[wid] = s
		rt.mu.Unlock()
		rt.dash.poke()
		// The worker's own room: task_cancelled for the tasks it holds
		// reaches this socket from any node.
		if err := s.Join(events.WorkerRoom(wid.String())); err != nil {
			return joinErrAck(err)
		}
	}
	if err := s.Join(room); err != nil {
		return joinErrAck(err)
	}
	return ack{OK: true}
}

// OnDisconnect schedules the disconnect cleanup of the socket's workers after
// the grace window. It is fenced by the session epoch of this socket's
// binding: a re-join (here or on another node) moves the epoch on and the
// cleanup then finds nothing to do.
func (rt *Realtime) OnDisconnect(s *sio.Socket, reason string) {
	rt.disconnects.WithLabelValues(reason).Inc()
	rt.dash.disconnected(reason)
	rt.mu.Lock()
	delete(rt.socks, s)
	rt.mu.Unlock()
	st, _ := s.Data().(*connState)
	if st == nil {
		return
	}
	st.mu.Lock()
	workers := st.workers
	st.workers = map[uuid.UUID]int64{}
	st.mu.Unlock()
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for wid, epoch := range workers {
		if rt.bound[wid] == s {
			delete(rt.bound, wid)
		}
		if rt.closed {
			continue
		}
		rt.log.Info("worker socket closed", "worker", wid, "reason", reason, "grace", rt.cfg.DisconnectGrace)
		if old := rt.graces[wid]; old != nil {
			old.Stop()
		}
		rt.graces[wid] = time.AfterFunc(rt.cfg.DisconnectGrace, func() { rt.expire(wid, epoch) })
	}
}

// expire runs the disconnect cleanup of one worker once its grace is over.
func (rt *Realtime) expire(wid uuid.UUID, epoch int64) {
	rt.mu.Lock()
	delete(rt.graces, wid)
	if rt.closed {
		rt.mu.Unlock()
		return
	}
	// Added under the lock Shutdown takes to set closed, so that Shutdown's
	// Wait either sees this cleanup or this cleanup sees closed.
	rt.wg.Add(1)
	rt.mu.Unlock()
	defer rt.wg.Done()
	ctx, cancel := rt.writeBudget(rt.ctx)
	defer cancel()
	// A timer that fires as the node wakes from a stall waits for the
	// lease check; a lease lost meanwhile changes nothing for it (the
	// cleanup is fenced by the binding's epoch, whoever acts first).
	if err := rt.svc.AwaitNodeLease(ctx); err != nil && !errors.Is(err, joblib.ErrNodeLeaseLost) {
		return
	}
	res, err := rt.svc.CleanupWorker(ctx, wid, joblib.DisconnectCleanup(epoch))
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			rt.log.Error("disconnect cleanup", "worker", wid, "err", err)
		}
		return
	}
	if res.Cleaned == 0 {
		rt.log.Debug("worker re-attached within grace; kept", "worker", wid)
	}
}
