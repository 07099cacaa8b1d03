package joblib

import (
	"context"
	"fmt"
	"os"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/models"
)

// Node identifies this process among the nodes sharing a database. ID is
// stable across restarts (JOBLIB_NODE_ID, default the hostname); Run is new
// on every start. A worker's socket binding records both, so that after a
// crash the next run of the same node knows which workers were its own and
// cleans those that did not re-attach elsewhere (startup recovery). Workers
// that never held a socket (REST-only) belong to no node and are judged by
// their heartbeat alone.
type Node struct {
	ID  string
	Run string
}

// NewNode returns the node named id (the hostname when empty) with a fresh
// run id.
func NewNode(id string) (Node, error) {
	if id == "" {
		h, err := os.Hostname()
		if err != nil {
			return Node{}, fmt.Errorf("node id from hostname: %w (set JOBLIB_NODE_ID)", err)
		}
		id = h
	}
	return Node{ID: id, Run: uuid.NewString()}, nil
}

// Node is the node this service runs as.
func (s *Service) Node() Node { return s.node }

// BindWorker records that this node's current run holds the worker's socket
// and starts a new session epoch, which it returns: the disconnect path
// cleans with Fence{Epoch: &epoch}, so a reconnect (a newer epoch, here or on
// another node) makes that cleanup a no-op.
func (s *Service) BindWorker(ctx context.Context, workerID uuid.UUID) (int64, error) {
	epoch, err := s.db.Q(ctx).BindWorker(workerID, s.node.ID, s.node.Run)
	if err != nil {
		return 0, notFound(err, s.workerGone(workerID))
	}
	return epoch, nil
}

// RecoverNode is startup recovery: it cleans, with path startup, every worker
// whose socket was bound to a previous run of this node and that has not
// been bound elsewhere since. Run it once at start, before serving sockets.
func (s *Service) RecoverNode(ctx context.Context) (CleanupResult, error) {
	st := s.Settings()
	p := CleanupParams{Path: PathStartup, Fence: models.CleanupFence{NodeID: s.node.ID, NodeRun: s.node.Run}}
	var res CleanupResult
	for {
		r, err := s.cleanupMatching(ctx, p, st.SweepBatchSize)
		res.merge(r)
		if err != nil || r.Cleaned < st.SweepBatchSize {
			s.observe(PathStartup, res)
			return res, err
		}
	}
}
