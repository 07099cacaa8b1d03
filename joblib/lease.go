package joblib

import (
	"context"
	"fmt"
	"log/slog"
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
	// OnLost is called when a renewal finds that the lease was taken away
	// (another node judged this one dead and released its workers): the
	// sockets this node holds should be closed so that their clients
	// reconnect and register again. It runs on the lease's goroutine.
	OnLost func()
	Logger *slog.Logger
}

// Lease is the background service that keeps this node's lease row alive:
// one row per run, renewed on the database clock. Start writes it (and
// expires the rows of earlier runs of the same node id, which the caller's
// node lock proves dead); Stop ends the lease at once, so that the sockets
// of a node that shuts down count as closed from that moment.
type Lease struct {
	startstop.Base
	svc *Service
	cfg LeaseConfig
	log *slog.Logger
}

// NewLease builds the lease of this service's node.
func (s *Service) NewLease(cfg LeaseConfig) *Lease {
	if cfg.Timeout <= 0 {
		cfg.Timeout = s.Settings().NodeLeaseTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = s.log
	}
	return &Lease{svc: s, cfg: cfg, log: cfg.Logger.With("component", "lease")}
}

// Start writes the lease and renews it in the background until Stop.
func (l *Lease) Start(ctx context.Context) error {
	n := l.svc.node
	if err := l.svc.db.Q(ctx).AcquireNodeLease(n.Run, n.ID, l.cfg.Addr, l.cfg.Timeout); err != nil {
		return err
	}
	sctx, ok := l.StartInit(ctx)
	if !ok {
		return nil
	}
	l.Go(func() { l.loop(sctx) })
	return nil
}

func (l *Lease) loop(ctx context.Context) {
	n := l.svc.node
	every := max(l.cfg.Timeout/3, 10*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			if err := l.svc.db.Q(sctx).ExpireNodeLease(n.Run); err != nil {
				l.log.Warn("end node lease", "err", err)
			} else {
				l.log.Info("node lease ended: clean stop; its sockets count as closed now", "node", n.ID, "run", n.Run)
			}
			cancel()
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, every)
		ok, err := l.svc.db.Q(rctx).RenewNodeLease(n.Run, l.cfg.Timeout)
		if err == nil && !ok {
			l.log.Error("this node's lease was taken away (judged dead by another node); closing its sockets and taking a new lease",
				"node", n.ID, "run", n.Run)
			err = l.svc.db.Q(rctx).AcquireNodeLease(n.Run, n.ID, l.cfg.Addr, l.cfg.Timeout)
			if l.cfg.OnLost != nil {
				l.cfg.OnLost()
			}
		}
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			if !failing {
				l.log.Error("renew node lease", "err", err)
			}
			failing = true
		case err == nil && failing:
			l.log.Info("node lease renewed again")
			failing = false
		}
	}
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
// and only after its outage guard (a database outage lapses every lease).
func (s *Service) ReapLostNodes(ctx context.Context, grace time.Duration) (NodeReapResult, error) {
	var out NodeReapResult
	nodes, err := s.db.Q(ctx).LapsedNodes(grace, 100)
	if err != nil {
		return out, err
	}
	batch := s.Settings().SweepBatchSize
	for _, n := range nodes {
		// Not SkipLocked: the lease row goes after this loop, so every
		// worker of the run must be seen (row locks are short).
		p := CleanupParams{Path: PathNode, Fence: models.CleanupFence{LostRun: n.Run, LostGrace: grace}}
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
		if _, err := s.db.Q(ctx).DeleteLapsedNode(n.Run, grace); err != nil {
			return out, err
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
