package joblib

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/models"
)

// Node identifies this process among the nodes sharing a database. ID is
// the node's name (JOBLIB_NODE_ID; by default the hostname plus a random
// part, so that no two processes ever share one); Run is new on every
// start. A worker's socket binding records both. Every run holds a lease
// row (see Lease): when it lapses, a surviving node releases the run's
// sockets. A restarted node with a fixed JOBLIB_NODE_ID also cleans, after
// the grace window, the workers its earlier runs held that did not
// re-attach (startup recovery). No two live processes share an ID: a
// process refuses to start when a live one holds its JOBLIB_NODE_ID (see
// the node lock in cmd/joblib), and recovery never touches a run whose
// lease is live. Workers that never held a socket (REST-only) belong to no
// node and are judged by their heartbeat alone.
type Node struct {
	ID  string
	Run string
	// Fixed: ID was configured (JOBLIB_NODE_ID), so later runs reuse it.
	Fixed bool
}

// NewNode returns the node named id with a fresh run id. An empty id means
// the hostname plus a random suffix, unique per process.
func NewNode(id string) (Node, error) {
	if id != "" {
		return Node{ID: id, Run: uuid.NewString(), Fixed: true}, nil
	}
	h, err := os.Hostname()
	if err != nil {
		return Node{}, fmt.Errorf("node id from hostname: %w (set JOBLIB_NODE_ID)", err)
	}
	run := uuid.NewString()
	return Node{ID: h + "-" + strings.ReplaceAll(run, "-", "")[:8], Run: run}, nil
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
