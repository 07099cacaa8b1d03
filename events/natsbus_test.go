package events_test

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/zndraw/joblib/events"
)

// natsURL is the test NATS server (scripts/test.sh starts one).
func natsURL() string {
	if u := os.Getenv("JOBLIB_TEST_NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

func openNATS(t *testing.T, subject, node string) *events.NATSBus {
	t.Helper()
	b := events.NewNATSBus(natsURL(), subject, node, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatalf("%v (run: bash scripts/test.sh, which starts nats-server)", err)
	}
	t.Cleanup(b.Stop)
	return b
}

// TestNATSBusCrossNode: what one node publishes reaches the other node's
// subscribers typed as sent, once, and the publisher's own subscribers once.
func TestNATSBusCrossNode(t *testing.T) {
	t.Parallel()
	subject := "joblib.test." + uuid.NewString()
	a, b := openNATS(t, subject, "na"), openNATS(t, subject, "nb")
	onA, onB := newCollector(), newCollector()
	a.Subscribe(onA.add)
	b.Subscribe(onB.add)
	gaps := watchGaps(b.Monitor())
	ctx := context.Background()
	qp := int64(2)
	for i := range 50 {
		ems := []events.Emission{{Room: events.Room("r"), Event: events.TaskStatusEvent{ID: "t" + string(rune('0'+i%10)), Status: "pending", QueuePosition: &qp}}}
		if err := a.Publish(ctx, ems); err != nil {
			t.Fatal(err)
		}
	}
	got := onB.wait(t, 50)
	if ts, ok := got[0].Event.(events.TaskStatusEvent); !ok || ts.ID != "t0" || *ts.QueuePosition != 2 || got[0].Room != "room:r" {
		t.Fatalf("remote node got %#v", got[0])
	}
	time.Sleep(200 * time.Millisecond) // let any duplicate arrive
	if n := len(onB.wait(t, 50)); n != 50 {
		t.Fatalf("remote node received %d emissions, want 50", n)
	}
	if n := len(onA.wait(t, 50)); n != 50 {
		t.Fatalf("publishing node received %d emissions, want its own 50 once", n)
	}
	if n := gaps.count(); n != 0 {
		t.Fatalf("%d gaps reported without loss", n)
	}
}

// TestNATSBusReportsSequenceGap: a batch of another node that never arrives
// (NATS core is at-most-once) is reported as a gap once the reorder window
// has passed, with the number of missing batches.
func TestNATSBusReportsSequenceGap(t *testing.T) {
	t.Parallel()
	subject := "joblib.test." + uuid.NewString()
	b := openNATS(t, subject, "nb")
	b.SetReorderWindow(100 * time.Millisecond)
	gaps := watchGaps(b.Monitor())
	onB := newCollector()
	b.Subscribe(onB.add)
	nc, err := nats.Connect(natsURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	send := func(seq uint64) {
		msg, _ := json.Marshal(map[string]any{"n": "lossy", "s": seq, "e": []map[string]any{{"r": "room:x", "t": "jobs_invalidate", "p": map[string]any{}}}})
		if err := nc.Publish(subject, msg); err != nil {
			t.Fatal(err)
		}
	}
	send(1)
	send(2)
	send(5) // 3 and 4 are lost
	onB.wait(t, 3)
	g := gaps.wait(t, events.GapSequence)
	if g.Origin != "lossy" || g.Missing != 2 {
		t.Fatalf("gap %+v, want 2 missing from lossy", g)
	}
}
