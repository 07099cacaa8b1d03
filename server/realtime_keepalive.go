package server

// Keep-alive: the heartbeats of this node's socket-bound workers.

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
)

// keepAlive refreshes the heartbeats of this node's socket-bound workers.
func (rt *Realtime) keepAlive() {
	t := time.NewTicker(rt.cfg.KeepAliveInterval)
	defer t.Stop()
	for {
		select {
		case <-rt.stop:
			return
		case <-t.C:
		}
		rt.mu.Lock()
		ids := make([]uuid.UUID, 0, len(rt.bound))
		for id := range rt.bound {
			ids = append(ids, id)
		}
		rt.mu.Unlock()
		if len(ids) == 0 {
			continue
		}
		gone, err := rt.svc.KeepAlive(rt.ctx, ids)
		if err != nil && !errors.Is(err, context.Canceled) {
			rt.log.Error("refresh socket-bound workers", "workers", len(ids), "err", err)
		}
		rt.dropWorkers(gone, "removed elsewhere")
	}
}
