package events_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

func openPG(t testing.TB, url, node string) *events.PGBus {
	t.Helper()
	ctx := context.Background()
	db, err := models.Open(ctx, url, models.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	b := events.NewPGBus(db.Pool, node, nil)
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	return b
}

// TestBusesDeliverInOneOrder: nodes publishing at once all deliver the same
// emissions, their own included, each named by the same unique offset on
// every node. On PostgreSQL they deliver them in one order (the NOTIFY
// queue's): what lets a client recover on any node. A NATS server orders
// each publisher's messages but may interleave two publishers differently
// for two subscribers, so there only each origin's order is the same
// everywhere (and recovery stays on the node a client was on).
func TestBusesDeliverInOneOrder(t *testing.T) {
	t.Parallel()
	buses := map[string]func(t *testing.T) []events.Bus{
		"postgres": func(t *testing.T) []events.Bus {
			url := dbtest.MigratedURL(t, models.Postgres)
			return []events.Bus{openPG(t, url, "oa"), openPG(t, url, "ob"), openPG(t, url, "oc")}
		},
		"nats": func(t *testing.T) []events.Bus {
			subject := "joblib.test." + uuid.NewString()
			return []events.Bus{openNATS(t, subject, "oa"), openNATS(t, subject, "ob"), openNATS(t, subject, "oc")}
		},
	}
	for name, open := range buses {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			nodes := open(t)
			cols := make([]*collector, len(nodes))
			for i, b := range nodes {
				cols[i] = newCollector()
				b.Subscribe(cols[i].add)
			}
			const perNode, batch = 60, 2
			var wg sync.WaitGroup
			for i, b := range nodes {
				for g := range 2 {
					wg.Go(func() {
						for k := g; k < perNode; k += 2 {
							ems := make([]events.Emission, batch)
							for j := range ems {
								ems[j] = events.Emission{Room: events.Room("order"), Event: events.TaskStatusEvent{ID: fmt.Sprintf("%d-%d-%d", i, k, j), Status: "pending"}}
							}
							if err := b.Publish(context.Background(), ems); err != nil {
								t.Error(err)
								return
							}
						}
					})
				}
			}
			wg.Wait()
			total := len(nodes) * perNode * batch
			first := cols[0].wait(t, total)
			seen := map[string]bool{}
			for _, e := range first {
				if e.Offset == "" || seen[e.Offset] {
					t.Fatalf("offset %q empty or repeated", e.Offset)
				}
				seen[e.Offset] = true
			}
			// origin keeps the emissions published by node o, in the order
			// they were delivered.
			origin := func(es []events.Emission, o int) []events.Emission {
				var out []events.Emission
				for _, e := range es {
					if strings.HasPrefix(e.Event.(events.TaskStatusEvent).ID, fmt.Sprintf("%d-", o)) {
						out = append(out, e)
					}
				}
				return out
			}
			for i, c := range cols[1:] {
				got := c.wait(t, total)
				if name == "postgres" {
					for k := range got {
						if got[k].Offset != first[k].Offset || got[k].Event != first[k].Event {
							t.Fatalf("node %d delivered #%d as %s %v, node 0 as %s %v", i+1, k, got[k].Offset, got[k].Event, first[k].Offset, first[k].Event)
						}
					}
					continue
				}
				for o := range nodes {
					want, have := origin(first, o), origin(got, o)
					if len(have) != len(want) {
						t.Fatalf("node %d delivered %d emissions of node %d, node 0 %d", i+1, len(have), o, len(want))
					}
					for k := range have {
						if have[k].Offset != want[k].Offset || have[k].Event != want[k].Event {
							t.Fatalf("node %d delivered node %d's #%d as %s, node 0 as %s", i+1, o, k, have[k].Offset, want[k].Offset)
						}
					}
				}
			}
			time.Sleep(100 * time.Millisecond)
			for i, c := range cols {
				if n := len(c.wait(t, total)); n != total {
					t.Fatalf("node %d delivered %d emissions, want %d", i, n, total)
				}
			}
		})
	}
}

// BenchmarkLocalDelivery measures the latency from Publish to this node's
// own subscriber: in-process (LocalBus, the baseline: what the PostgreSQL
// bus did before it delivered its own batches from the NOTIFY stream) and
// over NOTIFY (PGBus). One event at a time.
func BenchmarkLocalDelivery(b *testing.B) {
	url := dbtest.MigratedURL(b, models.Postgres)
	for _, tc := range []struct {
		name string
		bus  func(testing.TB) events.Bus
	}{
		{"in-process", func(testing.TB) events.Bus { return events.NewLocalBus() }},
		{"postgres-notify", func(tb testing.TB) events.Bus { return openPG(tb, url, "bench") }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			bus := tc.bus(b)
			got := make(chan struct{}, 1)
			bus.Subscribe(func(events.Emission) {
				select {
				case got <- struct{}{}:
				default:
				}
			})
			ems := []events.Emission{{Room: events.Room("bench"), Event: events.JobsInvalidate{}}}
			for b.Loop() {
				if err := bus.Publish(context.Background(), ems); err != nil {
					b.Fatal(err)
				}
				<-got
			}
		})
	}
}
