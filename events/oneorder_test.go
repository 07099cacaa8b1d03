package events_test

import (
	"testing"

	"github.com/zndraw/joblib/events"
)

// TestDeliversInOneOrder: only the NOTIFY bus promises every node one order
// of delivery; socket sessions are shared between nodes on that promise alone
// (a NATS server may interleave two publishers differently per subscriber).
func TestDeliversInOneOrder(t *testing.T) {
	for _, c := range []struct {
		name string
		bus  events.Bus
		want bool
	}{
		{"postgres", events.NewPGBus(nil, "n", nil), true},
		{"nats", events.NewNATSBus("nats://127.0.0.1:1", "s", "n", nil), false},
		{"local", events.NewLocalBus(), false},
	} {
		if got := events.DeliversInOneOrder(c.bus); got != c.want {
			t.Errorf("%s bus: DeliversInOneOrder %v, want %v", c.name, got, c.want)
		}
	}
}
