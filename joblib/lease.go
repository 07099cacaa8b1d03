package joblib

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/zndraw/joblib/internal/startstop"
	"github.com/zndraw/joblib/models"
)

// PathNode is the cleanup path of node loss: the worker's socket was held by
// a node whose lease lapsed, and it did not re-join elsewhere within the
// disconnect grace window.
const PathNode = "node"

// LeaseConfig configures a node's lease.
type LeaseConfig struct {
	// Addr is the internal address other nodes reach this one at (polling
	// requests for its sessions are forwarded there). May be empty.
	Addr string
	// Timeout is how long the lease lasts without renewal; it is renewed
	// every third of it. Default Settings.NodeLeaseTimeout.
	Timeout time.Duration
	// OnLost is called when a renewal finds that the lease lapsed by the
	// database's clock (this node stalled longer than its lease: SIGSTOP, a
	// frozen VM, a long pause) or was taken away (another node judged this
	// one dead and released its workers): the sockets this node holds
	// should be closed so that their clients reconnect and register again.
	// It runs on the lease's goroutine before the lease is taken anew, while
	// AwaitNodeLease holds every socket event back.
	OnLost func()
	// Now is the monotonic clock that measures stalls (durations only,
	// never compared with database timestamps). Default time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// Lease is the background service that keeps this node's lease row alive:
// one row per run, renewed on the database clock. Start writes it (and
// expires the rows of earlier runs of the same node id, which the caller's
// node lock proves dead); Stop ends the lease at once, so that the sockets
// of a node that shuts down count as closed from that moment.
//
// It is also this node's stall detector. The lease is known valid, by the
// monotonic clock, until one timeout after the last successful renewal was
// sent; past that (the process was paused, or the database did not answer)
// AwaitNodeLease holds the node's socket actions back until a renewal has
// asked the database. A renewal never extends a lapsed lease: the node then
// drops its sockets (OnLost) before it acts, and takes its lease anew.
type Lease struct {
	startstop.Base
	svc *Service
	cfg LeaseConfig
	log *slog.Logger

	mu    sync.Mutex
	until time.Time     // the lease is valid before this (monotonic)
	lost  int64         // number of losses so far
	wake  chan struct{} // closed (and replaced) when until or lost changes
}

// NewLease builds the lease of this service's node. The service's
// AwaitNodeLease and NodeLeaseValid consult it from then on.
func (s *Service) NewLease(cfg LeaseConfig) *Lease {
	if cfg.Timeout <= 0 {
		cfg.Timeout = s.Settings().NodeLeaseTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = s.log
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	l := &Lease{svc: s, cfg: cfg, log: cfg.Logger.With("component", "lease"), wake: make(chan struct{})}
	s.lease.Store(l)
	return l
}

// Start writes the lease and renews it in the background until Stop.
func (l *Lease) Start(ctx context.Context) error {
	n := l.svc.node
	sent := l.cfg.Now()
	if err := l.svc.db.Q(ctx).AcquireNodeLease(n.Run, n.ID, l.cfg.Addr, l.cfg.Timeout); err != nil {
		return err
	}
	l.renewed(sent, false)
	sctx, ok := l.StartInit(ctx)
	if !ok {
		return nil
	}
	l.Go(func() { l.loop(sctx, sent) })
	return nil
}

// renewed records a renewal sent at sent (valid one timeout from then) and,
// with lost, a loss before it.
func (l *Lease) renewed(sent time.Time, lost bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.until = sent.Add(l.cfg.Timeout)
	if lost {
		l.lost++
	}
	close(l.wake)
	l.wake = make(chan struct{})
}

// state returns whether the lease is known valid now, the loss count and
// the channel that is closed at the next change.
func (l *Lease) state() (bool, int64, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cfg.Now().Before(l.until), l.lost, l.wake
}

// leaseLoop is the renewal loop's state.
type leaseLoop struct {
	every    time.Duration
	lastOK   time.Time // when the last successful renewal was sent
	lastWake time.Time // the previous tick
	failing  bool
}

func (l *Lease) loop(ctx context.Context, lastOK time.Time) {
	st := &leaseLoop{every: max(l.cfg.Timeout/3, 10*time.Millisecond), lastOK: lastOK, lastWake: l.cfg.Now()}
	t := time.NewTicker(st.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			if err := l.svc.db.Q(sctx).ExpireNodeLease(l.svc.node.Run); err != nil {
				l.log.Warn("end node lease", "err", err)
			} else {
				l.log.Info("node lease ended: clean stop; its sockets count as closed now", "node", l.svc.node.ID, "run", l.svc.node.Run)
			}
			cancel()
			return
		case <-t.C:
		}
		l.tick(ctx, st)
	}
}

// tick renews the lease once. Past the lease by this process's clock (a
// pause, or renewals that failed) it logs the stall first; the database
// decides whether the lease lapsed. If it did, the node's sockets are
// dropped (OnLost) before the lease is taken anew and AwaitNodeLease lets
// anything act again.
func (l *Lease) tick(ctx context.Context, st *leaseLoop) {
	n := l.svc.node
	now := l.cfg.Now()
	stalled := now.Sub(st.lastWake) - st.every
	st.lastWake = now
	if since := now.Sub(st.lastOK); since >= l.cfg.Timeout {
		l.log.Warn("this node stalled longer than its lease; asking the database before it acts",
			"stalled_for", stalled.Round(time.Millisecond), "since_renewal", since.Round(time.Millisecond), "lease_timeout", l.cfg.Timeout)
	}
	rctx, cancel := context.WithTimeout(ctx, max(st.every, time.Second))
	defer cancel()
	sent := l.cfg.Now()
	ok, err := l.svc.db.Q(rctx).RenewNodeLease(n.Run, l.cfg.Timeout)
	if err == nil && ok {
		st.lastOK = sent
		l.renewed(sent, false)
	}
	if err == nil && !ok {
		l.log.Warn("this node's lease lapsed (it stalled, or another node judged it dead); dropping its sockets and taking a new lease",
			"node", n.ID, "run", n.Run, "since_renewal", now.Sub(st.lastOK).Round(time.Millisecond), "lease_timeout", l.cfg.Timeout)
		if l.cfg.OnLost != nil {
			l.cfg.OnLost()
		}
		sent = l.cfg.Now()
		if err = l.svc.db.Q(rctx).AcquireNodeLease(n.Run, n.ID, l.cfg.Addr, l.cfg.Timeout); err == nil {
			st.lastOK = sent
			l.renewed(sent, true)
		}
	}
	switch {
	case err != nil && ctx.Err() == nil:
		if !st.failing {
			l.log.Error("renew node lease", "err", err)
		}
		st.failing = true
	case err == nil && st.failing:
		l.log.Info("node lease renewed again")
		st.failing = false
	}
}

// ErrNodeLeaseLost answers an action that waited for this node's lease and
// found it lost meanwhile: the sockets it came from were dropped.
var ErrNodeLeaseLost = errors.New("this node lost its lease while the action waited")

// NodeLeaseValid reports whether this node's lease is known valid now by the
// monotonic clock (always true without a lease).
func (s *Service) NodeLeaseValid() bool {
	l := s.lease.Load()
	if l == nil {
		return true
	}
	ok, _, _ := l.state()
	return ok
}

// AwaitNodeLease returns at once while this node's lease is known valid.
// After a stall it waits until a renewal has asked the database: nil if the
// lease held, ErrNodeLeaseLost if it had lapsed (the node dropped its
// sockets and took a new lease meanwhile), or the context's error. The
// node's socket actions (events, keep-alives, disconnect cleanups) call it
// before they act.
func (s *Service) AwaitNodeLease(ctx context.Context) error {
	l := s.lease.Load()
	if l == nil {
		return nil
	}
	ok, lost0, wake := l.state()
	for !ok {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wake:
		}
		var lost int64
		ok, lost, wake = l.state()
		if lost != lost0 {
			return ErrNodeLeaseLost
		}
	}
	return nil
}

// NodeReapResult is what one pass over lapsed node leases did.
type NodeReapResult struct {
	Nodes  []models.NodeLease
	Result CleanupResult
}

// ReapLostNodes releases the sockets of node runs whose lease lapsed more
// than grace ago: their socket-bound workers that did not re-join elsewhere
// are cleaned with path node (fenced: bound to that run, lease still
// lapsed), then the lease row is deleted. Only the sweeper leader calls it,
// and only after its outage guard (a database outage lapses every lease),
// with its LeaderFence: every statement matches nothing once the caller's
// leadership lapsed (zero: unfenced, for operators).
func (s *Service) ReapLostNodes(ctx context.Context, grace time.Duration, lead LeaderFence) (NodeReapResult, error) {
	var out NodeReapResult
	nodes, err := s.db.Q(ctx).LapsedNodes(grace, 100)
	if err != nil {
		return out, err
	}
	batch := s.Settings().SweepBatchSize
	for _, n := range nodes {
		// Not SkipLocked: the lease row goes after this loop, so every
		// worker of the run must be seen (row locks are short).
		p := CleanupParams{Path: PathNode, Fence: models.CleanupFence{LostRun: n.Run, LostGrace: grace, Leader: lead}}
		var res CleanupResult
		for {
			r, err := s.cleanupMatching(ctx, p, batch)
			res.merge(r)
			if err != nil {
				s.observe(PathNode, res)
				out.Result.merge(res)
				return out, fmt.Errorf("release workers of lost node %s (run %s): %w", n.NodeID, n.Run, err)
			}
			if r.Cleaned < batch {
				break
			}
		}
		s.observe(PathNode, res)
		out.Result.merge(res)
		gone, err := s.db.Q(ctx).DeleteLapsedNode(n.Run, grace, lead)
		if err != nil {
			return out, err
		}
		if !gone {
			continue // renewed meanwhile, or this caller no longer leads
		}
		out.Nodes = append(out.Nodes, n)
		level, msg := slog.LevelWarn, "node lost: its lease lapsed; released its sockets"
		if n.Stopped() {
			level, msg = slog.LevelInfo, "node stopped cleanly: released its sockets"
		}
		s.log.Log(ctx, level, msg, "node", n.NodeID, "run", n.Run,
			"lease_expired", n.ExpiresAt.Time, "workers_cleaned", res.Cleaned, "tasks_failed", res.TasksFailed, "tasks_requeued", res.TasksRequeued)
	}
	return out, nil
}

// Nodes lists the node leases (operators, forwarding).
func (s *Service) Nodes(ctx context.Context) ([]models.NodeLease, error) {
	return s.db.Q(ctx).ListNodes()
}

// LiveNode returns the live lease of a node run (its advertised address).
func (s *Service) LiveNode(ctx context.Context, run string) (models.NodeLease, error) {
	return s.db.Q(ctx).LiveNode(run)
}
