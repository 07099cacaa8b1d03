package joblib

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// Events written to the outbox by a node that never relayed them (it died
// right after its commits) still reach every node, each exactly once and in
// the order they were written, while two live nodes relay at the same time
// (the relay lock keeps their batches from overtaking each other), and the
// outbox is empty afterwards.
func TestRelaySendsWhatADeadNodeLeft(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.Open(t, models.Postgres)
	open := func(node string) (*models.DB, *events.PGBus) { return relayNode(t, db, node) }
	_, dead := open("dead")
	dbA, busA := open("a")
	dbB, busB := open("b")
	_, busC := open("c")
	var mu sync.Mutex
	var got []string
	all := make(chan struct{})
	const n = 600
	busC.Subscribe(func(e events.Emission) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, e.Room)
		if len(got) == n {
			close(all)
		}
	})
	a := New(Config{DB: dbA, Bus: busA})
	b := New(Config{DB: dbB, Bus: busB})
	for _, s := range []*Service{a, b} {
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
	}

	// The dead node's commits: batches of 20 rows; the live relays are woken
	// after each, so they run while rows are still being written.
	want := make([]string, n)
	for i := range want {
		want[i] = fmt.Sprintf("r%04d", i)
	}
	for batch := range slices.Chunk(want, 20) {
		err := db.Tx(ctx, func(q *models.Q) error {
			for _, room := range batch {
				msg, err := dead.Notification(ctx, []events.Emission{{Room: room, Event: events.JobsInvalidate{}}})
				if err != nil {
					return err
				}
				if err := q.WriteOutbox(msg); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		a.relay.poke()
		b.relay.poke()
	}
	received := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
	select {
	case <-all:
	case <-time.After(30 * time.Second):
		t.Fatalf("node c received %d of %d events", len(received()), n)
	}
	// Anything sent twice would follow within a relay pass.
	time.Sleep(200 * time.Millisecond)
	if r := received(); !slices.Equal(r, want) {
		t.Fatalf("node c received %d events, out of order or twice:\n%v", len(r), r)
	}
	var left int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM joblib_event_outbox").Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("%d rows left in the outbox", left)
	}
}

// A row written by a transaction that rolls back is never sent, and rows a
// node wrote before it stops are sent by its last relay pass at Stop.
func TestRelayRollbackAndStop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, a, s, remote := pokedRelay(t) // only pokes and Stop relay here

	write := func(room string, commit bool) {
		t.Helper()
		msg, err := a.Notification(ctx, []events.Emission{{Room: room, Event: events.JobsInvalidate{}}})
		if err != nil {
			t.Fatal(err)
		}
		err = db.Tx(ctx, func(q *models.Q) error {
			if err := q.WriteOutbox(msg); err != nil {
				return err
			}
			if !commit {
				return errTestRollback
			}
			return nil
		})
		if commit != (err == nil) {
			t.Fatalf("write %s: %v", room, err)
		}
	}
	write("rolled-back", false)
	write("first", true)
	s.relay.poke()
	remote.waitFor(t, "first")
	write("at-stop", true) // no poke: only the last pass at Stop sends it
	// Two stops at once (serve's shutdown and a signal, say): neither
	// returns before the last pass has sent the row.
	var stops sync.WaitGroup
	for range 2 {
		stops.Go(func() {
			s.relay.stop()
			var left int
			if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM joblib_event_outbox").Scan(&left); err != nil {
				t.Error(err)
			} else if left != 0 {
				t.Errorf("a stop returned with %d rows still in the outbox", left)
			}
		})
	}
	stops.Wait()
	s.Stop()
	if got := remote.waitFor(t, "at-stop"); !slices.Equal(got, []string{"first", "at-stop"}) {
		t.Fatalf("the other node received %v", got)
	}
}

var errTestRollback = fmt.Errorf("roll back")

// pokedRelay opens a database with node A's bus and service, whose relay
// runs only when poked or stopped, and node B's bus, whose received rooms
// remote collects.
func pokedRelay(t *testing.T) (db *models.DB, a *events.PGBus, s *Service, remote *seen) {
	t.Helper()
	db = dbtest.Open(t, models.Postgres)
	a = startBus(t, db, "a")
	_, b := relayNode(t, db, "b")
	remote = newSeen()
	b.Subscribe(remote.add)
	s = New(Config{DB: db, Bus: a})
	s.relay.interval = time.Hour
	t.Cleanup(s.Close)
	return db, a, s, remote
}

// writeOutbox commits one outbox row: bus's notification of a
// jobs_invalidate for room, as a mutation on d would write it.
func writeOutbox(t *testing.T, d *models.DB, bus *events.PGBus, room string) {
	t.Helper()
	ctx := context.Background()
	msg, err := bus.Notification(ctx, []events.Emission{{Room: room, Event: events.JobsInvalidate{}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Tx(ctx, func(q *models.Q) error { return q.WriteOutbox(msg) }); err != nil {
		t.Fatal(err)
	}
}

// relayNode opens a pool of its own on db and starts a PostgreSQL bus for
// node on it, as a joblib node would.
func relayNode(t *testing.T, db *models.DB, node string) (*models.DB, *events.PGBus) {
	t.Helper()
	ctx := context.Background()
	d, err := models.Open(ctx, db.URL(), models.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, startBus(t, d, node)
}

// startBus starts a PostgreSQL bus for node on db's pool.
func startBus(t *testing.T, db *models.DB, node string) *events.PGBus {
	t.Helper()
	b := events.NewPGBus(db.Pool, node, nil)
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	return b
}

// Tasks go through their lifecycle on two nodes at once, each step on the
// other node than the one before (submit on A, claim on B, running on A,
// completed on B), eight workers in parallel on the one-statement paths: a
// third node receives every task's status events exactly once and in the
// order of the changes, though two relays send them.
func TestRelayKeepsEachTaskInOrderAcrossNodes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.Open(t, models.Postgres)
	open := func(node string) (*models.DB, *events.PGBus) { return relayNode(t, db, node) }
	dbA, busA := open("a")
	dbB, busB := open("b")
	_, busC := open("c")
	st := DefaultSettings()
	st.SubmitRate = 0
	a := New(Config{DB: dbA, Bus: busA, Settings: st})
	b := New(Config{DB: dbB, Bus: busB, Settings: st})
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)

	const workers, perWorker = 8, 15
	var mu sync.Mutex
	seen := map[string][]string{}
	done := make(chan struct{})
	busC.Subscribe(func(e events.Emission) {
		ev, ok := e.Event.(events.TaskStatusEvent)
		if !ok {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		seen[ev.ID] = append(seen[ev.ID], ev.Status)
		n := 0
		for _, s := range seen {
			if len(s) >= 4 {
				n++
			}
		}
		if n == workers*perWorker && ev.Status == models.StatusCompleted {
			select {
			case <-done:
			default:
				close(done)
			}
		}
	})

	_, alice, err := a.CreateToken(ctx, "alice", false)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]uuid.UUID, workers)
	for i := range ids {
		w, err := a.CreateWorker(ctx, alice)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := a.RegisterJob(ctx, alice, "r", RegisterJobParams{Category: "modifiers", Name: fmt.Sprint("J", i), WorkerID: &w.ID}); err != nil {
			t.Fatal(err)
		}
		ids[i] = w.ID
	}
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
			for range perWorker {
				if _, err := a.SubmitTask(ctx, alice, "r", fmt.Sprint("r:modifiers:J", i), nil); err != nil {
					t.Error(err)
					return
				}
				task, err := b.ClaimTask(ctx, alice, ids[i])
				if err != nil || task == nil {
					t.Errorf("claim: %v %v", task, err)
					return
				}
				if _, err := a.UpdateTask(ctx, alice, task.ID, models.StatusRunning, nil); err != nil {
					t.Error(err)
					return
				}
				if _, err := b.UpdateTask(ctx, alice, task.ID, models.StatusCompleted, nil); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
	}
	time.Sleep(200 * time.Millisecond) // anything sent twice would follow within a pass
	// Fail without holding mu: a blocked subscriber would hang the bus's Stop.
	mu.Lock()
	heard := maps.Clone(seen)
	mu.Unlock()
	if len(heard) != workers*perWorker {
		t.Fatalf("node c heard of %d tasks, want %d", len(heard), workers*perWorker)
	}
	want := []string{models.StatusPending, models.StatusClaimed, models.StatusRunning, models.StatusCompleted}
	for id, got := range heard {
		if !slices.Equal(got, want) {
			t.Fatalf("task %s: node c received %v, want %v", id, got, want)
		}
	}
}

// A busy relay spaces its passes (here by a fixed gap): commits that each wake it
// while it is at work share passes, so the passes are at most one per gap,
// while every row still goes out, once and in order. A wake after a quiet
// spell is relayed at once, without waiting for a gap. The gaps here are
// 50 ms and 2 s (in production 3 ms), so that the bounds hold on a loaded
// machine.
func TestRelaySpacesItsPassesUnderLoad(t *testing.T) {
	t.Parallel()
	db := dbtest.Open(t, models.Postgres)
	a := startBus(t, db, "a")
	_, b := relayNode(t, db, "b")
	remote := newSeen()
	b.Subscribe(remote.add)
	service := func(gap time.Duration) *Service {
		s := New(Config{DB: db, Bus: a})
		s.relay.interval = time.Hour // only pokes relay here
		fixGap(s.relay, gap)
		t.Cleanup(s.Close)
		return s
	}
	write := func(s *Service, room string) {
		t.Helper()
		writeOutbox(t, db, a, room)
		s.relay.poke()
	}

	// After a quiet spell (the relay has never run): at once, well within
	// the gap.
	quiet := service(2 * time.Second)
	start := time.Now()
	write(quiet, "quiet")
	remote.waitFor(t, "quiet")
	if d := time.Since(start); d >= quiet.relay.minGap {
		t.Errorf("an event after a quiet spell took %s, the relay waited out its gap of %s", d, quiet.relay.minGap)
	}

	// Under load: commits one after the other, each waking the relay.
	busy := service(50 * time.Millisecond)
	const n = 200
	start = time.Now()
	want := []string{"quiet"}
	for i := range n {
		room := fmt.Sprintf("r%03d", i)
		want = append(want, room)
		write(busy, room)
	}
	got := remote.waitFor(t, want[n])
	took := time.Since(start)
	passes := busy.relay.passes.Load()
	if limit := int64(took/busy.relay.minGap) + 2; passes > limit {
		t.Errorf("%d commits in %s took %d relay passes, want at most one per %s gap (%d)", n, took, passes, busy.relay.minGap, limit)
	}
	time.Sleep(2 * busy.relay.minGap) // anything sent twice would follow
	if got = remote.list(); !slices.Equal(got, want) {
		t.Fatalf("received %d events, want %d once each in order:\n%v", len(got), len(want), got)
	}
	t.Logf("%d commits in %s, %d relay passes", n, took.Round(time.Millisecond), passes)
}

// A node whose rows another node's relay sent skips its own pass: node A's
// wake for a frame whose rows came back to its listener (node B relayed
// them) finds nothing to do, while a wake that names no frame always runs a
// pass (TestRelayRollbackAndStop). Every row is received once, in order.
func TestRelaySkipsWhatAnotherNodeSent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.Open(t, models.Postgres)
	open := func(node string) (*models.DB, *events.PGBus) { return relayNode(t, db, node) }
	dbA, busA := open("a")
	dbB, busB := open("b")
	_, busC := open("c")
	remote, onA := newSeen(), newSeen()
	busC.Subscribe(remote.add)
	busA.Subscribe(onA.add)
	a := New(Config{DB: dbA, Bus: busA})
	a.relay.interval = time.Hour
	fixGap(a.relay, time.Second) // long enough for B to relay within it
	b := New(Config{DB: dbB, Bus: busB})
	b.relay.interval = time.Hour
	for _, s := range []*Service{a, b} {
		t.Cleanup(s.Close)
	}
	// A statement of node A writes a row under a frame, as the hot
	// statements do; A's relay is woken for the frame separately.
	write := func(room string) uint64 {
		t.Helper()
		f := busA.Frame(events.JobsInvalidate{}.EventName())
		r, _ := json.Marshal(room)
		msg := f.Payload(f.Item(string(r), "{}"))
		if err := dbA.Tx(ctx, func(q *models.Q) error { return q.WriteOutbox(msg) }); err != nil {
			t.Fatal(err)
		}
		return f.ID
	}
	// A wake whose frame came back before it (B relayed the row first):
	// the frame stays owed until a pass of A's own settles it.
	first := write("first")
	b.relay.poke()
	remote.waitFor(t, "first")
	onA.waitFor(t, "first")   // A's listener has had the echo
	a.relay.pokeFrames(first) // a quiet relay: A's pass at once
	waitUntil(t, func() bool { return a.relay.passes.Load() == 1 })
	// A wake within A's gap, whose row B's pass sends meanwhile.
	a.relay.pokeFrames(write("second"))
	b.relay.poke()
	remote.waitFor(t, "second")
	time.Sleep(a.relay.minGap + 300*time.Millisecond)
	if p := a.relay.passes.Load(); p != 1 {
		t.Errorf("node A ran %d relay passes, want 1: its second wake's row had come back from B's pass", p)
	}
	if p := b.relay.passes.Load(); p < 1 {
		t.Errorf("node B ran %d relay passes", p)
	}
	if got := remote.list(); !slices.Equal(got, []string{"first", "second"}) {
		t.Fatalf("received %v", got)
	}
	var left int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM joblib_event_outbox").Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("%d rows left in the outbox", left)
	}
}

// A relay pass that finds another relay at work (it holds the relay lock)
// sends nothing and does not wait for it: it tells its caller it was busy,
// and the relay tries again a gap later, while what it was woken for is
// still owed. Its rows are not lost when the other pass did not carry them:
// once the lock is free, the retry sends them, once.
func TestRelayFindingAnotherAtWorkTriesAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, a, s, remote := pokedRelay(t)
	fixGap(s.relay, 100*time.Millisecond)

	writeOutbox(t, db, a, "held")
	// Another node's pass, stalled while holding the relay lock.
	other, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx)
	if _, err := other.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('joblib:outbox'), hashtext(current_schema()))"); err != nil {
		t.Fatal(err)
	}
	if n, busy, err := db.RelayOutbox(ctx, a.Channel(), 10, false); err != nil || !busy || n != 0 {
		t.Fatalf("a pass while another holds the lock: sent %d, busy %t, err %v; want nothing sent, busy", n, busy, err)
	}

	s.relay.poke()
	waitUntil(t, func() bool { return s.relay.passes.Load() >= 3 }) // the pass and two retries, all busy
	if got := remote.list(); len(got) != 0 {
		t.Fatalf("received %v while the lock was held", got)
	}
	if err := other.Rollback(ctx); err != nil { // the other pass ends without sending
		t.Fatal(err)
	}
	remote.waitFor(t, "held")
	time.Sleep(3 * s.relay.minGap) // anything sent twice would follow
	if got := remote.list(); !slices.Equal(got, []string{"held"}) {
		t.Fatalf("received %v, want the row once", got)
	}
}

// The busy relays of a deployment share one gap: a node that hears another
// node's pass spaces its own from that one, as from a pass of its own, so
// that N busy nodes do not run N passes per gap. After a quiet spell a wake
// still runs at once (TestRelaySpacesItsPassesUnderLoad).
func TestRelaySpacesItsPassFromAnotherNodes(t *testing.T) {
	t.Parallel()
	db := dbtest.Open(t, models.Postgres)
	dbA, busA := relayNode(t, db, "a")
	dbB, busB := relayNode(t, db, "b")
	remote := newSeen()
	busB.Subscribe(remote.add)
	a := New(Config{DB: dbA, Bus: busA})
	a.relay.interval = time.Hour
	b := New(Config{DB: dbB, Bus: busB})
	b.relay.interval = time.Hour
	fixGap(b.relay, 2*time.Second)
	for _, s := range []*Service{a, b} {
		t.Cleanup(s.Close)
	}
	writeOutbox(t, dbA, busA, "from-a")
	a.relay.poke()
	remote.waitFor(t, "from-a") // B has heard A's pass
	heard := busB.LastHeard()
	writeOutbox(t, dbB, busB, "from-b")
	b.relay.poke()
	remote.waitFor(t, "from-b")
	if d := time.Since(heard); d < b.relay.minGap {
		t.Errorf("node B relayed %s after hearing node A's pass, inside its gap of %s", d, b.relay.minGap)
	}
	if p := b.relay.passes.Load(); p != 1 {
		t.Errorf("node B ran %d passes, want 1", p)
	}
}

// fixGap gives r a fixed gap d between busy passes (no growth under load).
func fixGap(r *relay, d time.Duration) { r.minGap, r.maxGap = d, d }

// The gap follows the load: it doubles for each wake that comes inside it,
// up to the upper bound, returns to the lower one after that long without a
// pass, and stays put for a wake that comes after it but sooner.
func TestNextGap(t *testing.T) {
	const lo, hi = 3 * time.Millisecond, 12 * time.Millisecond
	for _, c := range []struct {
		name            string
		cur, idle, want time.Duration
	}{
		{"a wake inside the short gap doubles it", lo, time.Millisecond, 2 * lo},
		{"a wake right after a pass doubles it", 2 * lo, 0, 4 * lo},
		{"growth stops at the upper bound", 8 * time.Millisecond, time.Millisecond, hi},
		{"at the upper bound a wake inside it keeps it", hi, 5 * time.Millisecond, hi},
		{"a light load keeps the short gap", lo, 5 * time.Millisecond, lo},
		{"a wake after the gap but before the quiet keeps a grown one", 6 * time.Millisecond, 8 * time.Millisecond, 6 * time.Millisecond},
		{"a quiet spell brings it back down", hi, hi, lo},
		{"a long quiet spell too", hi, time.Hour, lo},
	} {
		if got := nextGap(c.cur, c.idle, lo, hi); got != c.want {
			t.Errorf("%s: nextGap(%s, idle %s) = %s, want %s", c.name, c.cur, c.idle, got, c.want)
		}
	}
}

// Under a sustained stream of commits the relay's gap grows to its upper
// bound, so the passes are about one per upper gap rather than one per
// lower gap; every row still goes out once and in order. After a quiet
// spell the gap is short again: a wake then runs at once, and so does one
// that follows it after a little more than the short gap, where the grown
// gap would have held it back. The bounds here are 25 ms and 800 ms (in
// production 3 and 12 ms) so that they hold on a loaded machine.
func TestRelayGapFollowsTheLoad(t *testing.T) {
	t.Parallel()
	db, a, s, remote := pokedRelay(t)
	s.relay.minGap, s.relay.maxGap = 25*time.Millisecond, 800*time.Millisecond
	write := func(room string) {
		t.Helper()
		writeOutbox(t, db, a, room)
		s.relay.poke()
	}

	// A stream of commits, one every 5 ms, for two seconds.
	var want []string
	start := time.Now()
	for i := 0; time.Since(start) < 2*time.Second; i++ {
		room := fmt.Sprintf("r%04d", i)
		want = append(want, room)
		write(room)
		time.Sleep(5 * time.Millisecond)
	}
	remote.waitFor(t, want[len(want)-1])
	took := time.Since(start)
	passes := s.relay.passes.Load()
	// Doubling from 25 to 800 ms takes five passes; after that one per 800 ms.
	if limit := int64(took/s.relay.maxGap) + 5 + 2; passes > limit {
		t.Errorf("%d commits in %s took %d relay passes, want at most %d: the gap did not grow to %s",
			len(want), took, passes, limit, s.relay.maxGap)
	}
	t.Logf("%d commits in %s, %d relay passes", len(want), took.Round(time.Millisecond), passes)

	// Quiet for longer than the upper gap, then two wakes 60 ms apart: both
	// go out at once (well within the upper gap).
	time.Sleep(s.relay.maxGap + 200*time.Millisecond)
	for _, room := range []string{"after-quiet", "soon-after"} {
		start := time.Now()
		write(room)
		want = append(want, room)
		remote.waitFor(t, room)
		if d := time.Since(start); d >= s.relay.maxGap/2 {
			t.Errorf("%s took %s to go out: the relay kept its grown gap of %s after a quiet spell", room, d, s.relay.maxGap)
		}
		time.Sleep(60 * time.Millisecond)
	}
	time.Sleep(2 * s.relay.minGap) // anything sent twice would follow
	if got := remote.list(); !slices.Equal(got, want) {
		t.Fatalf("received %d events, want %d once each in order", len(got), len(want))
	}
}
