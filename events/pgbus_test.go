package events_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

type collector struct {
	mu  sync.Mutex
	got []events.Emission
	ch  chan struct{}
}

func newCollector() *collector { return &collector{ch: make(chan struct{}, 64)} }

func (c *collector) add(e events.Emission) {
	c.mu.Lock()
	c.got = append(c.got, e)
	c.mu.Unlock()
	select {
	case c.ch <- struct{}{}:
	default:
	}
}

func (c *collector) wait(t *testing.T, n int) []events.Emission {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		c.mu.Lock()
		if len(c.got) >= n {
			out := append([]events.Emission(nil), c.got...)
			c.mu.Unlock()
			return out
		}
		c.mu.Unlock()
		select {
		case <-c.ch:
		case <-deadline:
			t.Fatalf("received %d emissions, want %d", len(c.got), n)
		}
	}
}

// TestPGBusCrossNode: what one node publishes reaches the other node's
// subscribers typed as it was sent, once; batches over the NOTIFY limit go
// through the spill table; a node does not receive its own batches twice.
func TestPGBusCrossNode(t *testing.T) {
	t.Parallel()
	url := dbtest.MigratedURL(t, models.Postgres)
	ctx := context.Background()
	open := func(node string) *events.PGBus {
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
	a, b := open("node-a"), open("node-b")
	onA, onB := newCollector(), newCollector()
	a.Subscribe(onA.add)
	b.Subscribe(onB.add)

	qp := int64(3)
	small := []events.Emission{
		{Room: events.Room("r1"), Event: events.TaskStatusEvent{ID: "t1", Name: "r1:c:n", RoomID: "r1", Status: "pending", QueuePosition: &qp}},
		{Room: events.Room("r1"), Event: events.JobsInvalidate{}},
	}
	if err := a.Publish(ctx, small); err != nil {
		t.Fatal(err)
	}
	got := onB.wait(t, 2)
	ts, ok := got[0].Event.(events.TaskStatusEvent)
	if !ok || ts.ID != "t1" || *ts.QueuePosition != 3 || got[0].Room != "room:r1" {
		t.Fatalf("remote node got %#v", got[0])
	}
	if _, ok := got[1].Event.(events.JobsInvalidate); !ok {
		t.Fatalf("remote node got %#v", got[1])
	}

	big := strings.Repeat("x", 20000)
	if err := a.Publish(ctx, []events.Emission{{Room: events.Room("r2"), Event: events.TaskStatusEvent{ID: "t2", Status: "failed", Error: &big}}}); err != nil {
		t.Fatal(err)
	}
	got = onB.wait(t, 3)
	if ts := got[2].Event.(events.TaskStatusEvent); ts.ID != "t2" || *ts.Error != big {
		t.Fatalf("spilled batch arrived as %#v", got[2])
	}
	time.Sleep(200 * time.Millisecond) // let any duplicate arrive
	if n := len(onA.wait(t, 3)); n != 3 {
		t.Fatalf("publishing node received %d emissions, want its own 3 once", n)
	}
	if n := len(onB.wait(t, 3)); n != 3 {
		t.Fatalf("remote node received %d emissions, want 3", n)
	}
}

// TestPGBusNeedsMigratedSchema: the spill table belongs to the migrations;
// a bus started on a schema joblib never migrated says so at Start instead of
// failing later on the first batch too large for one NOTIFY.
func TestPGBusNeedsMigratedSchema(t *testing.T) {
	ctx := t.Context()
	db, err := models.Open(ctx, dbtest.URL(t, models.Postgres), models.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	b := events.NewPGBus(db.Pool, "unmigrated", nil)
	err = b.Start(ctx)
	if err == nil {
		b.Stop()
		t.Fatal("a bus started on a schema without the spill table")
	}
	if !strings.Contains(err.Error(), "joblib migrate") {
		t.Fatalf("Start failed with %v, want it to name `joblib migrate`", err)
	}
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatalf("after migrate: %v", err)
	}
	b.Stop()
}

// gapCollector records the gaps a bus reports.
type gapCollector struct {
	mu   sync.Mutex
	gaps []events.Gap
	ch   chan struct{}
}

func watchGaps(m *events.Monitor) *gapCollector {
	c := &gapCollector{ch: make(chan struct{}, 16)}
	m.OnGap(func(g events.Gap) {
		c.mu.Lock()
		c.gaps = append(c.gaps, g)
		c.mu.Unlock()
		select {
		case c.ch <- struct{}{}:
		default:
		}
	})
	return c
}

func (c *gapCollector) wait(t *testing.T, reason string) events.Gap {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		c.mu.Lock()
		for _, g := range c.gaps {
			if g.Reason == reason {
				c.mu.Unlock()
				return g
			}
		}
		c.mu.Unlock()
		select {
		case <-c.ch:
		case <-deadline:
			t.Fatalf("no %s gap reported", reason)
		}
	}
}

func (c *gapCollector) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.gaps)
}

// TestPGBusReportsListenerReconnect: when the LISTEN connection dies, what
// other nodes publish meanwhile is lost; the bus reports a reconnect gap
// once it listens again, and delivery resumes.
func TestPGBusReportsListenerReconnect(t *testing.T) {
	t.Parallel()
	url := dbtest.MigratedURL(t, models.Postgres)
	ctx := context.Background()
	db, err := models.Open(ctx, url, models.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	open := func(node string) *events.PGBus { return startBus(t, db, node) }
	a, b := open("rc-a"), open("rc-b")
	gaps := watchGaps(b.Monitor())
	onB := newCollector()
	b.Subscribe(onB.add)
	if _, err := db.Pool.Exec(ctx, "SELECT pg_terminate_backend($1)", b.ListenerPID()); err != nil {
		t.Fatal(err)
	}
	gaps.wait(t, events.GapReconnect)
	if err := a.Publish(ctx, []events.Emission{{Room: events.Room("rc"), Event: events.JobsInvalidate{}}}); err != nil {
		t.Fatal(err)
	}
	onB.wait(t, 1)
}

// TestPGBusScopedBySchema: NOTIFY channels are database-wide; deployments in
// different schemas of one database do not receive each other's events.
func TestPGBusScopedBySchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	open := func(url, node string) *events.PGBus {
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
	one, two := dbtest.MigratedURL(t, models.Postgres), dbtest.MigratedURL(t, models.Postgres)
	a, same, other := open(one, "sc-a"), open(one, "sc-same"), open(two, "sc-other")
	onSame, onOther := newCollector(), newCollector()
	same.Subscribe(onSame.add)
	other.Subscribe(onOther.add)
	big := strings.Repeat("y", 9000) // spilled, too
	for _, ev := range []events.Event{events.JobsInvalidate{}, events.TaskStatusEvent{ID: "t", Status: "failed", Error: &big}} {
		if err := a.Publish(ctx, []events.Emission{{Room: events.Room("scoped"), Event: ev}}); err != nil {
			t.Fatal(err)
		}
	}
	onSame.wait(t, 2)
	time.Sleep(200 * time.Millisecond)
	onOther.mu.Lock()
	defer onOther.mu.Unlock()
	if len(onOther.got) != 0 {
		t.Fatalf("a deployment in another schema received %d emissions", len(onOther.got))
	}
}

// Spilled batches older than the retention are deleted on a timer, even when
// nothing is spilled any more; younger ones stay for slow listeners.
func TestPGBusCleansSpillOnTimer(t *testing.T) {
	t.Parallel()
	url := dbtest.MigratedURL(t, models.Postgres)
	ctx := context.Background()
	db, err := models.Open(ctx, url, models.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	b := events.NewPGBus(db.Pool, "node-a", nil)
	b.SpillRetention = time.Minute
	b.SpillCleanInterval = 20 * time.Millisecond
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	var old, young int64
	if err := db.Pool.QueryRow(ctx, "INSERT INTO joblib_event_spill (payload, created_at) VALUES ('{}', now() - interval '61 seconds') RETURNING id").Scan(&old); err != nil {
		t.Fatal(err)
	}
	if err := db.Pool.QueryRow(ctx, "INSERT INTO joblib_event_spill (payload, created_at) VALUES ('{}', now() - interval '50 seconds') RETURNING id").Scan(&young); err != nil {
		t.Fatal(err)
	}
	count := func(id int64) int {
		var n int
		if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM joblib_event_spill WHERE id = $1", id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	deadline := time.Now().Add(10 * time.Second)
	for count(old) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("an old spilled batch was not cleaned within 10s of 20ms intervals")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if count(young) != 1 {
		t.Fatal("a spilled batch younger than the retention was deleted")
	}
	b.Stop()
	b.Stop() // idempotent
}

// Each schema has a NOTIFY channel of its own: a deployment in another schema
// of the same database is not even sent the notifications.
func TestPGBusChannelPerSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	one, two := dbtest.MigratedURL(t, models.Postgres), dbtest.MigratedURL(t, models.Postgres)
	open := func(url, node string) (*models.DB, *events.PGBus) {
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
		return db, b
	}
	_, pub := open(one, "ch-pub")
	dbTwo, other := open(two, "ch-other")
	if pub.Channel() == other.Channel() {
		t.Fatalf("two schemas share the NOTIFY channel %q", pub.Channel())
	}
	// A raw listener on the other schema's channel hears nothing of the
	// first schema's publishes (and, as a control, hears its own schema's).
	conn, err := dbTwo.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `LISTEN "`+other.Channel()+`"`); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx, []events.Emission{{Room: events.Room("x"), Event: events.JobsInvalidate{}}}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	n, err := conn.Conn().WaitForNotification(wctx)
	cancel()
	if err == nil {
		t.Fatalf("the other schema's channel received %q", n.Payload)
	}
	_, same := open(two, "ch-same")
	if err := same.Publish(ctx, []events.Emission{{Room: events.Room("x"), Event: events.JobsInvalidate{}}}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel = context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := conn.Conn().WaitForNotification(wctx); err != nil {
		t.Fatalf("control: no notification from the listener's own schema: %v", err)
	}
}

// A batch that names another deployment (or none) is dropped even when it
// arrives on this bus's channel.
func TestPGBusDropsBatchesOfOtherScopes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.Open(t, models.Postgres)
	b := events.NewPGBus(db.Pool, "scope-b", nil)
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	got := newCollector()
	b.Subscribe(got.add)
	var schema string
	if err := db.Pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	send := func(scope string) {
		payload := `{"n":"foreign","d":"` + scope + `","e":[{"r":"room:s","t":"jobs_invalidate","p":{}}]}`
		if _, err := db.Pool.Exec(ctx, "SELECT pg_notify($1, $2)", b.Channel(), payload); err != nil {
			t.Fatal(err)
		}
	}
	send("some_other_schema")
	send("")
	send(schema) // the control: this one is ours
	got.wait(t, 1)
	time.Sleep(200 * time.Millisecond)
	got.mu.Lock()
	defer got.mu.Unlock()
	if len(got.got) != 1 {
		t.Fatalf("delivered %d batches, want only the one of this schema", len(got.got))
	}
}

// OnEcho hears the frames of its own node only: node B's frames are
// numbered from 1 too, and must not pass for node A's (A's relay would take
// its own rows for sent). Batches built by Notification carry no frame.
func TestPGBusEchoesItsOwnFrames(t *testing.T) {
	t.Parallel()
	url := dbtest.MigratedURL(t, models.Postgres)
	ctx := context.Background()
	db, err := models.Open(ctx, url, models.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	open := func(node string) *events.PGBus { return startBus(t, db, node) }
	a, b := open("node-a"), open("node-b")
	var mu sync.Mutex
	var echoed []uint64
	a.OnEcho(func(f uint64) { mu.Lock(); echoed = append(echoed, f); mu.Unlock() })
	onA := newCollector()
	a.Subscribe(onA.add)
	notify := func(payload string) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, "SELECT pg_notify($1, $2)", a.Channel(), payload); err != nil {
			t.Fatal(err)
		}
	}
	framed := func(bus *events.PGBus, room string) uint64 {
		f := bus.Frame(events.JobsInvalidate{}.EventName())
		notify(f.Payload(f.Item(`"`+room+`"`, "{}")))
		return f.ID
	}
	fb := framed(b, "from-b") // B's first frame: the same id as A's first
	msg, err := a.Notification(ctx, []events.Emission{{Room: "plain", Event: events.JobsInvalidate{}}})
	if err != nil {
		t.Fatal(err)
	}
	notify(msg)
	fa := framed(a, "from-a")
	if fa != fb {
		t.Fatalf("frame ids %d and %d: the test wants the same id on both nodes", fa, fb)
	}
	onA.wait(t, 3)
	mu.Lock()
	defer mu.Unlock()
	if len(echoed) != 1 || echoed[0] != fa {
		t.Fatalf("node A's echoes %v, want its own frame %d only", echoed, fa)
	}
}

// startBus starts a bus for node on db's pool, stopped with the test.
func startBus(t *testing.T, db *models.DB, node string) *events.PGBus {
	t.Helper()
	b := events.NewPGBus(db.Pool, node, nil)
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	return b
}
