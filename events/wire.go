package events

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strconv"
	"sync"
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
	Scope string `json:"d,omitempty"`
	Ref   int64  `json:"ref,omitempty"`
	Seq   uint64 `json:"s,omitempty"`
	// ID names a batch built by a SQL statement (see PGBus.Frame): unique
	// per node run and statement; the rows one statement notifies share it.
	ID    uint64     `json:"i,omitempty"`
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

// offsetNamer names received batches for connection state recovery. Every
// node receives the batches of the bus in one order, so a name built from
// the batch alone is the same on every node: the origin node, "s" and its
// sequence number or "i" and its statement id, the batch's rank among the
// batches of that statement received so far (one statement may notify
// several rows; a transaction's notifications reach a listener all or none),
// and the emission's index in the batch. Batches without a number get no
// offsets (their emissions are not recorded for recovery).
type offsetNamer struct {
	mu    sync.Mutex
	ranks map[string]int
	keys  []string // FIFO of the keys in ranks, to bound it
}

// maxNamedKeys bounds the statement keys whose rank is remembered: a
// statement's notifications arrive together, long before this many others.
const maxNamedKeys = 1 << 16

func (n *offsetNamer) name(batch wireBatch, ems []Emission) {
	var key string
	switch {
	case batch.Seq != 0:
		key = "s" + strconv.FormatUint(batch.Seq, 36)
	case batch.ID != 0:
		key = "i" + strconv.FormatUint(batch.ID, 36)
	default:
		return
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(batch.Node))
	key = strconv.FormatUint(uint64(h.Sum32()), 36) + "-" + key
	n.mu.Lock()
	if n.ranks == nil {
		n.ranks = map[string]int{}
	}
	rank, seen := n.ranks[key]
	if seen {
		rank++
	} else {
		n.keys = append(n.keys, key)
		if len(n.keys) > maxNamedKeys {
			delete(n.ranks, n.keys[0])
			n.keys = n.keys[1:]
		}
	}
	n.ranks[key] = rank
	base := key + "-" + strconv.Itoa(rank) + "-"
	n.mu.Unlock()
	for i := range ems {
		ems[i].Offset = base + strconv.Itoa(i)
	}
}

// receiveBatch checks a received batch's sequence, records its lag, names
// its emissions and delivers them to this node's subscribers.
func receiveBatch(batch wireBatch, local *LocalBus, names *offsetNamer, track *seqTracker, mon *Monitor, log *slog.Logger) {
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
	if len(ems) == len(batch.Items) {
		names.name(batch, ems)
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
