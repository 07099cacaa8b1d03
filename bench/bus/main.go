// Command bus measures the event bus between joblib nodes: events per second
// and delivery lag percentiles across -nodes nodes, for PostgreSQL NOTIFY and
// NATS in the same run (so the ratio is meaningful on a shared machine).
//
// Each node is an events bus with its own connection pool (PostgreSQL, in a
// private schema dropped at the end) or its own NATS connection (a private
// subject). Every node publishes -events one-event batches from -publishers
// goroutines at once; the run ends when every node has received every other
// node's events. Lag is the publisher's clock at publish to the receiver's
// at receipt (one host, one clock).
//
//	go run ./bench/bus -events 2000
//
// -db defaults to JOBLIB_TEST_DATABASE_URL (else the test PostgreSQL), -nats
// to nats://127.0.0.1:4222.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/models"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bus:", err)
		os.Exit(1)
	}
}

type options struct {
	db, nats   string
	nodes      int
	events     int
	publishers int
	rate       int
	timeout    time.Duration
}

type node struct {
	bus      events.Bus
	stop     func()
	received atomic.Int64
	mu       sync.Mutex
	lags     []time.Duration
	gaps     atomic.Int64
}

type result struct {
	name     string
	elapsed  time.Duration
	events   int64
	lags     []time.Duration
	gaps     int64
	received int64
}

func run(ctx context.Context, args []string, out io.Writer) error {
	o := options{}
	fs := flag.NewFlagSet("bus", flag.ContinueOnError)
	def := os.Getenv("JOBLIB_TEST_DATABASE_URL")
	if def == "" {
		def = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	fs.StringVar(&o.db, "db", def, "PostgreSQL URL (a private schema is created in it)")
	fs.StringVar(&o.nats, "nats", "nats://127.0.0.1:4222", "NATS URL")
	fs.IntVar(&o.nodes, "nodes", 3, "nodes")
	fs.IntVar(&o.events, "events", 2000, "events each node publishes")
	fs.IntVar(&o.publishers, "publishers", 8, "publishing goroutines per node")
	fs.IntVar(&o.rate, "rate", 300, "events/s per node of the paced run (lag at a steady rate); 0 skips it")
	fs.DurationVar(&o.timeout, "timeout", 2*time.Minute, "bound of each run")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.nodes < 2 || o.events < 1 || o.publishers < 1 {
		return fmt.Errorf("need -nodes >= 2, -events >= 1, -publishers >= 1")
	}
	fmt.Fprintf(out, "%d nodes, %d one-event batches per node, %d publishers per node\n", o.nodes, o.events, o.publishers)
	var burst, paced []result
	for _, kind := range []string{"notify", "nats"} {
		r, err := measure(ctx, o, kind, 0)
		if err != nil {
			return fmt.Errorf("%s: %w", kind, err)
		}
		burst = append(burst, r)
		report(out, "burst", r)
		if o.rate > 0 {
			r, err := measure(ctx, o, kind, o.rate)
			if err != nil {
				return fmt.Errorf("%s paced: %w", kind, err)
			}
			paced = append(paced, r)
			report(out, fmt.Sprintf("%d/s", o.rate), r)
		}
	}
	a, b := burst[0], burst[1]
	fmt.Fprintf(out, "nats/notify: burst throughput %.2fx, burst p99 lag %.2fx", rate(b)/rate(a), ratio(pct(b.lags, 0.99), pct(a.lags, 0.99)))
	if len(paced) == 2 {
		fmt.Fprintf(out, ", paced p99 lag %.2fx", ratio(pct(paced[1].lags, 0.99), pct(paced[0].lags, 0.99)))
	}
	fmt.Fprintln(out)
	return nil
}

func report(out io.Writer, mode string, r result) {
	fmt.Fprintf(out, "%-7s %-6s %8.0f events/s  lag p50 %9s  p99 %9s  max %9s  (%d deliveries to other nodes, %d gaps, %s)\n",
		r.name, mode, rate(r), pct(r.lags, 0.50), pct(r.lags, 0.99), pct(r.lags, 1), r.received, r.gaps, r.elapsed.Round(time.Millisecond))
}

func rate(r result) float64 { return float64(r.events) / r.elapsed.Seconds() }

func ratio(a, b time.Duration) float64 { return float64(a) / float64(max(b, 1)) }

// measure runs one bus; perNodeRate > 0 paces each node's publishing.
func measure(ctx context.Context, o options, kind string, perNodeRate int) (result, error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	var nodes []*node
	defer func() {
		for _, n := range nodes {
			n.stop()
		}
	}()
	var dropSchema func()
	dbURL := ""
	if kind == "notify" {
		u, drop, err := privateSchema(ctx, o.db)
		if err != nil {
			return result{}, err
		}
		dbURL, dropSchema = u, drop
		defer dropSchema()
	}
	subject := "joblib.bench." + uuid.NewString()
	for i := range o.nodes {
		n := &node{}
		name := fmt.Sprintf("bench-%d-%s", i, uuid.NewString())
		switch kind {
		case "notify":
			db, err := models.Open(ctx, dbURL, models.OpenOptions{MaxConns: int32(o.publishers + 4)})
			if err != nil {
				return result{}, err
			}
			if i == 0 {
				// The bus needs joblib's schema (its spill table).
				if _, err := db.Migrate(ctx); err != nil {
					db.Close()
					return result{}, err
				}
			}
			b := events.NewPGBus(db.Pool, name, nil)
			if err := b.Start(ctx); err != nil {
				db.Close()
				return result{}, err
			}
			n.bus, n.stop = b, func() { b.Stop(); db.Close() }
		case "nats":
			b := events.NewNATSBus(o.nats, subject, name, nil)
			if err := b.Start(ctx); err != nil {
				return result{}, err
			}
			n.bus, n.stop = b, b.Stop
		}
		mon := n.bus.(events.Monitored).Monitor()
		mon.OnLag(func(d time.Duration) { n.mu.Lock(); n.lags = append(n.lags, d); n.mu.Unlock() })
		mon.OnGap(func(events.Gap) { n.gaps.Add(1) })
		n.bus.Subscribe(func(events.Emission) { n.received.Add(1) })
		nodes = append(nodes, n)
	}
	// Everyone receives every event once, its own included, from the bus.
	want := int64(o.nodes * o.events)
	start := time.Now()
	var wg sync.WaitGroup
	errc := make(chan error, o.nodes*o.publishers)
	for i, n := range nodes {
		for p := range o.publishers {
			wg.Go(func() {
				for k := p; k < o.events; k += o.publishers {
					if perNodeRate > 0 {
						// Event k of this node is due k/rate after the start.
						if d := time.Until(start.Add(time.Duration(k) * time.Second / time.Duration(perNodeRate))); d > 0 {
							time.Sleep(d)
						}
					}
					ev := events.TaskStatusEvent{ID: fmt.Sprintf("%d-%d", i, k), Name: "bench:modifiers:J", RoomID: "bench", Status: "pending"}
					if err := n.bus.Publish(ctx, []events.Emission{{Room: events.Room("bench"), Event: ev}}); err != nil {
						errc <- err
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return result{}, err
	}
	for _, n := range nodes {
		for n.received.Load() < want {
			if ctx.Err() != nil {
				return result{}, fmt.Errorf("a node received %d of %d events before the timeout", n.received.Load(), want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	r := result{name: kind, elapsed: time.Since(start), events: want}
	for _, n := range nodes {
		n.mu.Lock()
		r.lags = append(r.lags, n.lags...)
		n.mu.Unlock()
		r.gaps += n.gaps.Load()
		r.received += int64(len(n.lags))
	}
	return r, nil
}

func pct(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q * float64(len(s)-1))
	return s[i].Round(10 * time.Microsecond)
}

// privateSchema creates a schema for one run and returns a URL that uses it.
func privateSchema(ctx context.Context, base string) (string, func(), error) {
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", nil, err
	}
	defer conn.Close(ctx)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "bench_" + hex.EncodeToString(b)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return "", nil, err
	}
	drop := func() {
		c, err := pgx.Connect(context.Background(), base)
		if err == nil {
			_, _ = c.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
			c.Close(context.Background())
		}
	}
	u, err := url.Parse(base)
	if err != nil {
		drop()
		return "", nil, err
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), drop, nil
}
