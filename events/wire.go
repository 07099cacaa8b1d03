package events

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"
)

// ReorderWindow is how long a receiver waits for a missing sequence number
// before it reports a gap.
const ReorderWindow = 2 * time.Second

// wireBatch is how emissions travel between nodes (NOTIFY payloads, NATS
// messages): the publishing node run, its sequence number for the batch
// (0 for batches built by SQL statements, which are not numbered), the
// publisher's clock in Unix microseconds (lag), and the emissions.
type wireBatch struct {
	Node string `json:"n"`
	// Scope is the deployment (the PostgreSQL schema): NOTIFY channels are
	// database-wide, so deployments sharing a database in different schemas
	// hear each other's batches and drop those of other scopes (all nodes
	// of a deployment must send it: batches without one are dropped).
	Scope string     `json:"d,omitempty"`
	Ref   int64      `json:"ref,omitempty"`
	Seq   uint64     `json:"s,omitempty"`
	At    int64      `json:"at,omitempty"`
	Items []wireItem `json:"e,omitempty"`
}

type wireItem struct {
	Room    string          `json:"r"`
	Name    string          `json:"t"`
	Payload json.RawMessage `json:"p"`
}

func encodeBatch(node, scope string, seq uint64, ems []Emission) ([]byte, error) {
	batch := wireBatch{Node: node, Scope: scope, Seq: seq, At: time.Now().UnixMicro(), Items: make([]wireItem, len(ems))}
	for i, e := range ems {
		batch.Items[i] = wireItem{Room: e.Room, Name: e.Event.EventName(), Payload: e.Payload()}
	}
	msg, err := json.Marshal(batch)
	if err != nil {
		return nil, fmt.Errorf("encode event batch: %w", err)
	}
	return msg, nil
}

// receiveBatch checks a received batch's sequence, records its lag and
// delivers its emissions to this node's subscribers.
func receiveBatch(batch wireBatch, local *LocalBus, track *seqTracker, mon *Monitor, log *slog.Logger) {
	if batch.At > 0 {
		mon.lag(time.Since(time.UnixMicro(batch.At)))
	}
	ems := make([]Emission, 0, len(batch.Items))
	for _, it := range batch.Items {
		ev, err := Decode(it.Name, it.Payload)
		if err != nil {
			log.Warn("undecodable event", "err", err)
			continue
		}
		ems = append(ems, Emission{Room: it.Room, Event: ev})
	}
	local.Deliver(ems)
	for _, g := range track.observe(batch.Node, batch.Seq) {
		reportGap(g, mon, log)
	}
}

func reportGap(g Gap, mon *Monitor, log *slog.Logger) {
	log.Warn("event batches of another node were lost; clients are told to refetch", "origin", g.Origin, "missing", g.Missing)
	mon.gap(g)
}

// expireLoop reports sequence gaps whose reorder window has passed even
// when nothing else arrives.
func expireLoop(ctx context.Context, track *seqTracker, mon *Monitor, log *slog.Logger) {
	t := time.NewTicker(ReorderWindow / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, g := range track.expire() {
			reportGap(g, mon, log)
		}
	}
}
