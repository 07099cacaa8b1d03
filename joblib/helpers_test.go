package joblib_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// bundle is one service over a fresh database with a recorder on its bus.
type bundle struct {
	t     testing.TB
	ctx   context.Context
	db    *models.DB
	svc   *joblib.Service
	rec   *recorder
	admin joblib.Principal
	alice joblib.Principal
}

func setup(t testing.TB, db *models.DB, tweak ...func(*joblib.Settings)) *bundle {
	t.Helper()
	st := joblib.DefaultSettings()
	for _, f := range tweak {
		f(&st)
	}
	bus := events.NewLocalBus()
	rec := &recorder{}
	unsub := bus.Subscribe(rec.add)
	svc := joblib.New(joblib.Config{DB: db, Bus: bus, Settings: st, Node: joblib.Node{ID: "node-a", Run: uuid.NewString()}})
	t.Cleanup(func() { unsub(); svc.Close() })
	b := &bundle{t: t, ctx: context.Background(), db: db, svc: svc, rec: rec}
	var err error
	if _, b.admin, err = svc.CreateToken(b.ctx, "admin", true); err != nil {
		t.Fatal(err)
	}
	if _, b.alice, err = svc.CreateToken(b.ctx, "alice", false); err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *bundle) must(err error) {
	b.t.Helper()
	if err != nil {
		b.t.Fatal(err)
	}
}

// worker creates a worker for alice linked to the given jobs (full names of
// jobs in room "r", categories "modifiers").
func (b *bundle) worker(jobs ...jobSpec) uuid.UUID {
	b.t.Helper()
	w, err := b.svc.CreateWorker(b.ctx, b.alice)
	b.must(err)
	for _, j := range jobs {
		_, _, err := b.svc.RegisterJob(b.ctx, b.alice, "r", joblib.RegisterJobParams{Category: "modifiers", Name: j.name, WorkerID: &w.ID,
			OnWorkerLoss: j.policy, MaxAttempts: j.attempts})
		b.must(err)
	}
	return w.ID
}

type jobSpec struct {
	name     string
	policy   string
	attempts int
}

func (j jobSpec) full() string { return "r:modifiers:" + j.name }

func (b *bundle) submit(j jobSpec) uuid.UUID {
	b.t.Helper()
	t, err := b.svc.SubmitTask(b.ctx, b.alice, "r", j.full(), nil)
	b.must(err)
	return t.ID
}

func (b *bundle) claim(w uuid.UUID) uuid.UUID {
	b.t.Helper()
	t, err := b.svc.ClaimTask(b.ctx, b.alice, w)
	b.must(err)
	if t == nil {
		b.t.Fatalf("worker %s claimed nothing", w)
	}
	return t.ID
}

func (b *bundle) task(id uuid.UUID) models.Task {
	b.t.Helper()
	t, err := b.db.Q(b.ctx).GetTask(id)
	b.must(err)
	return t
}

func (b *bundle) age(ids []uuid.UUID, d time.Duration) {
	b.t.Helper()
	b.must(b.db.Q(b.ctx).SetHeartbeatAge(ids, d))
}

func (b *bundle) workerExists(id uuid.UUID) bool {
	b.t.Helper()
	_, err := b.db.Q(b.ctx).GetWorker(id)
	if err != nil && err != models.ErrNotFound {
		b.t.Fatal(err)
	}
	return err == nil
}

func (b *bundle) events(worker uuid.UUID) []models.CleanupEvent {
	b.t.Helper()
	es, err := b.db.Q(b.ctx).ListCleanupEvents(models.CleanupEventFilter{WorkerID: &worker}, 100)
	b.must(err)
	return es
}

// recorder keeps every published emission.
type recorder struct {
	mu  sync.Mutex
	ems []events.Emission
}

func (r *recorder) add(e events.Emission) {
	r.mu.Lock()
	r.ems = append(r.ems, e)
	r.mu.Unlock()
}

func (r *recorder) take() []events.Emission {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.ems
	r.ems = nil
	return out
}

// statusEvents counts task_status_event emissions per task id.
func statusEvents(ems []events.Emission) map[string][]events.TaskStatusEvent {
	out := map[string][]events.TaskStatusEvent{}
	for _, e := range ems {
		if ev, ok := e.Event.(events.TaskStatusEvent); ok {
			out[ev.ID] = append(out[ev.ID], ev)
		}
	}
	return out
}

// counting reopens a PostgreSQL test database with a pool that counts the
// statements it sends in stmts (SQLite's db is returned as it is).
func counting(t *testing.T, db *models.DB, stmts *atomic.Int64) *models.DB {
	t.Helper()
	if db.Dialect() != models.Postgres {
		return db
	}
	counted, err := models.Open(context.Background(), db.URL(), models.OpenOptions{Statements: stmts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { counted.Close() })
	return counted
}
