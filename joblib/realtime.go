package joblib

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/models"
)

// CheckWorker verifies that a worker exists and belongs to the caller.
func (s *Service) CheckWorker(ctx context.Context, p Principal, workerID uuid.UUID) error {
	_, err := ownedWorker(s.db.Q(ctx), p, workerID)
	return err
}

// CheckJob verifies that a live job with this full name exists.
func (s *Service) CheckJob(ctx context.Context, fullName string) error {
	_, err := resolveJob(s.db.Q(ctx), fullName)
	return err
}

// CheckProvider verifies that a provider with this full name exists and
// belongs to the caller (its requests carry the readers' parameters, so only
// its owner may listen to them).
func (s *Service) CheckProvider(ctx context.Context, p Principal, fullName string) error {
	room, cat, name, ok := SplitFullName(fullName)
	if !ok {
		return errf(CodeProviderNotFound, "Invalid provider name format: %s", fullName)
	}
	if !addressable(room, cat, name) {
		return errf(CodeProviderNotFound, "Provider '%s' not found", fullName)
	}
	prov, err := s.db.Q(ctx).ProviderByKey(room, cat, name, false)
	if errors.Is(err, models.ErrNotFound) {
		return errf(CodeProviderNotFound, "Provider '%s' not found", fullName)
	}
	if err != nil {
		return err
	}
	if prov.UserID != p.ID && !p.Superuser {
		return errf(CodeForbidden, "Provider belongs to different user")
	}
	return nil
}

// KeepAlive refreshes the heartbeat of workers whose sockets are open on this
// node, in one statement, with the database's clock. It returns the ids that
// are no workers any more: another node or process removed them (an
// operator, the sweeper), and their sockets should be closed. It refreshes
// nothing while this node's lease is not known valid (after a stall, until a
// renewal has asked the database), and the statement itself is fenced by
// the lease: a node whose lease lapsed keeps nobody alive.
func (s *Service) KeepAlive(ctx context.Context, ids []uuid.UUID) ([]uuid.UUID, error) {
	if !s.NodeLeaseValid() {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := s.db.Q(ctx).TouchWorkers(ids, s.node.Run)
	if err != nil || n >= int64(len(ids)) {
		return nil, err
	}
	live, err := s.db.Q(ctx).ExistingWorkers(ids)
	if err != nil {
		return nil, err
	}
	var gone []uuid.UUID
	for _, id := range ids {
		if !slices.Contains(live, id) {
			gone = append(gone, id)
		}
	}
	return gone, nil
}

// DisconnectCleanup are the parameters of the disconnect path for a socket
// binding with this epoch: the cleanup happens only if the binding is still
// the worker's current one.
func DisconnectCleanup(epoch int64) CleanupParams {
	e := epoch
	return CleanupParams{Path: PathDisconnect, Fence: models.CleanupFence{Epoch: &e}}
}
