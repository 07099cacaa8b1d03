package models_test

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// The statements that carry joblib's invariants, tested on their own: claim
// (each task once, FIFO by sequence, locked rows skipped), the cleanup fence
// (session epoch, staleness, node run) and staleness judged by the database's
// clock.

const lost = "Worker disconnected"

// fixture is a user and helpers over one database.
type fixture struct {
	t    *testing.T
	db   *models.DB
	q    *models.Q
	user uuid.UUID
}

func newFixture(t *testing.T, db *models.DB) *fixture {
	t.Helper()
	q := db.Q(context.Background())
	u, err := q.CreateUser("alice", false)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, db: db, q: q, user: u.ID}
}

func (f *fixture) must(err error) {
	f.t.Helper()
	if err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) job(name, policy string, maxAttempts int) models.Job {
	f.t.Helper()
	j := models.Job{ID: uuid.New(), RoomID: "r", Category: "modifiers", Name: name, Schema: "{}", OnWorkerLoss: policy, MaxAttempts: maxAttempts}
	f.must(f.q.UpsertJobAlways(j))
	got, err := f.q.JobByKey("r", "modifiers", name)
	f.must(err)
	return got
}

// worker creates a worker linked to the jobs.
func (f *fixture) worker(jobs ...models.Job) uuid.UUID {
	f.t.Helper()
	w, err := f.q.InsertWorker(f.user)
	f.must(err)
	for _, j := range jobs {
		f.must(f.q.LinkWorkerJob(w.ID, j.ID))
	}
	return w.ID
}

func (f *fixture) task(j models.Job) uuid.UUID {
	f.t.Helper()
	id := uuid.New()
	_, err := f.q.InsertTask(id, j.ID, "r", &f.user, "{}", models.StatusPending)
	f.must(err)
	return id
}

func (f *fixture) claim(w uuid.UUID) (uuid.UUID, bool) {
	f.t.Helper()
	tk, ok, err := f.q.ClaimTask(w)
	f.must(err)
	return tk.ID, ok
}

func (f *fixture) get(id uuid.UUID) models.Task {
	f.t.Helper()
	tk, err := f.q.GetTask(id)
	f.must(err)
	return tk
}

func (f *fixture) exists(w uuid.UUID) bool {
	f.t.Helper()
	_, err := f.q.GetWorker(w)
	if err != nil && err != models.ErrNotFound {
		f.t.Fatal(err)
	}
	return err == nil
}

func (f *fixture) audit(w uuid.UUID) []models.CleanupEvent {
	f.t.Helper()
	es, err := f.q.ListCleanupEvents(models.CleanupEventFilter{WorkerID: &w}, 100)
	f.must(err)
	return es
}

// age sets the workers' last heartbeat to the database's now minus d with a
// statement of the test's own: it does not share the staleness expression
// under test, so a bug there cannot move the aging along with it.
func (f *fixture) age(d time.Duration, ids ...uuid.UUID) {
	f.t.Helper()
	secs := int(d / time.Second)
	var expr string
	if f.db.Dialect() == models.Postgres {
		expr = fmt.Sprintf("now() - interval '%d seconds'", secs)
	} else {
		expr = fmt.Sprintf("strftime('%%Y-%%m-%%dT%%H:%%M:%%fZ', 'now', '-%d seconds')", secs)
	}
	f.must(f.db.ExecRaw("UPDATE workers SET last_heartbeat = "+expr+" WHERE id IN ?", ids))
}

// Claims hand every task out exactly once, to concurrent claimers of several
// workers, and leave nothing pending.
func TestClaimEachTaskOnce(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		f := newFixture(t, db)
		j := f.job("J", "fail", 1)
		const tasks, perWorker = 60, 2
		workers := []uuid.UUID{f.worker(j), f.worker(j), f.worker(j), f.worker(j)}
		want := map[uuid.UUID]bool{}
		for range tasks {
			want[f.task(j)] = true
		}
		type claim struct{ task, worker uuid.UUID }
		var (
			mu     sync.Mutex
			claims []claim
			wg     sync.WaitGroup
		)
		start := make(chan struct{})
		for _, w := range workers {
			for range perWorker {
				wg.Go(func() {
					<-start
					q := db.Q(context.Background())
					for {
						tk, ok, err := q.ClaimTask(w)
						if err != nil {
							t.Error(err)
							return
						}
						if !ok {
							return
						}
						mu.Lock()
						claims = append(claims, claim{tk.ID, w})
						mu.Unlock()
					}
				})
			}
		}
		close(start)
		wg.Wait()
		seen := map[uuid.UUID]uuid.UUID{}
		for _, c := range claims {
			if prev, dup := seen[c.task]; dup {
				t.Fatalf("task %s claimed twice (by %s and %s)", c.task, prev, c.worker)
			}
			seen[c.task] = c.worker
			if !want[c.task] {
				t.Fatalf("claimed unknown task %s", c.task)
			}
		}
		if len(claims) != tasks {
			t.Fatalf("%d claims for %d tasks", len(claims), tasks)
		}
		for id, w := range seen {
			tk := f.get(id)
			if tk.Status != models.StatusClaimed || tk.WorkerID == nil || *tk.WorkerID != w || tk.Attempt != 1 {
				t.Fatalf("task %s after claim: status %s worker %v attempt %d, claimed by %s", id, tk.Status, tk.WorkerID, tk.Attempt, w)
			}
		}
	})
}

// FIFO is by the insertion sequence, not by timestamps: tasks whose
// created_at runs backwards (clock steps, identical instants) are still
// claimed oldest submission first, and only tasks of the worker's jobs.
func TestClaimFIFOBySequence(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		f := newFixture(t, db)
		j, other := f.job("J", "fail", 1), f.job("Other", "fail", 1)
		w := f.worker(j)
		var order []uuid.UUID
		for i := range 8 {
			order = append(order, f.task(j))
			f.task(other)
			// Each later submission carries an earlier timestamp.
			var ts string
			if db.Dialect() == models.Postgres {
				ts = fmt.Sprintf("now() - interval '%d seconds'", i)
			} else {
				ts = fmt.Sprintf("strftime('%%Y-%%m-%%dT%%H:%%M:%%fZ', 'now', '-%d seconds')", i)
			}
			f.must(db.ExecRaw("UPDATE tasks SET created_at = "+ts+" WHERE id = ?", order[i]))
		}
		for i, want := range order {
			got, ok := f.claim(w)
			if !ok || got != want {
				t.Fatalf("claim %d: got %s (ok %v), want %s, the %d. submitted", i, got, ok, want, i+1)
			}
		}
		if got, ok := f.claim(w); ok {
			t.Fatalf("claimed %s of a job the worker does not serve", got)
		}
	})
}

// On PostgreSQL a claim skips a row another transaction holds and takes the
// next one at once, instead of waiting or answering "nothing to claim".
// (SQLite has no row locks: its single connection serialises claimers.)
func TestClaimSkipsLockedRows(t *testing.T) {
	t.Parallel()
	db := dbtest.Open(t, models.Postgres)
	f := newFixture(t, db)
	j := f.job("J", "fail", 1)
	w := f.worker(j)
	first, second := f.task(j), f.task(j)

	ctx := context.Background()
	holder, err := db.Pool.Begin(ctx)
	f.must(err)
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, "SELECT id FROM tasks WHERE id = $1 FOR UPDATE", first); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	tk, ok, err := db.Q(cctx).ClaimTask(w)
	if err != nil || !ok || tk.ID != second {
		t.Fatalf("claim while the oldest task is locked: %s ok %v err %v, want %s at once", tk.ID, ok, err, second)
	}
	f.must(holder.Rollback(ctx))
	if got, ok := f.claim(w); !ok || got != first {
		t.Fatalf("after the lock was released: %s ok %v, want %s", got, ok, first)
	}
}

// A cleanup fenced by a session epoch does nothing once the worker has been
// bound again (a newer epoch): the worker, its claim, its links stay, and no
// audit row is written. The current epoch cleans.
func TestCleanupFenceEpoch(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		f := newFixture(t, db)
		j := f.job("J", "fail", 1)
		w := f.worker(j)
		old, err := f.q.BindWorker(w, "node-a", "run-1")
		f.must(err)
		tk := f.task(j)
		if got, ok := f.claim(w); !ok || got != tk {
			t.Fatalf("claim: %s %v", got, ok)
		}
		cur, err := f.q.BindWorker(w, "node-b", "run-2")
		f.must(err)
		if cur <= old {
			t.Fatalf("rebinding went from epoch %d to %d", old, cur)
		}

		out, err := f.q.CleanupWorkers([]uuid.UUID{w}, models.CleanupFence{Epoch: &old}, lost, models.CleanupAudit{Path: "disconnect"})
		f.must(err)
		if !out.Empty() || len(out.Tasks) != 0 || len(out.OrphanJobs) != 0 {
			t.Fatalf("old-epoch cleanup acted: %d workers, %d tasks, %d orphaned jobs", len(out.Workers), len(out.Tasks), len(out.OrphanJobs))
		}
		if !f.exists(w) {
			t.Fatal("old-epoch cleanup removed the re-bound worker")
		}
		if got := f.get(tk); got.Status != models.StatusClaimed || got.WorkerID == nil || *got.WorkerID != w {
			t.Fatalf("claimed task after old-epoch cleanup: %s by %v", got.Status, got.WorkerID)
		}
		if es := f.audit(w); len(es) != 0 {
			t.Fatalf("old-epoch cleanup wrote audit rows %+v", es)
		}
		next := f.task(j)
		if got, ok := f.claim(w); !ok || got != next {
			t.Fatalf("re-bound worker lost its job link: claim %s %v", got, ok)
		}

		out, err = f.q.CleanupWorkers([]uuid.UUID{w}, models.CleanupFence{Epoch: &cur}, lost, models.CleanupAudit{Path: "disconnect"})
		f.must(err)
		if len(out.Workers) != 1 || out.Workers[0].TasksFailed != 2 || f.exists(w) {
			t.Fatalf("current-epoch cleanup: %d workers (want 1, with 2 tasks failed); worker still there: %v", len(out.Workers), f.exists(w))
		}
		if es := f.audit(w); len(es) != 1 || es[0].Path != "disconnect" {
			t.Fatalf("audit rows %+v", es)
		}
	})
}

// A cleanup fenced by staleness leaves a worker that heartbeated within the
// threshold alone; a worker past it is cleaned. CleanupMatching picks only
// the stale ones.
func TestCleanupFenceStaleness(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		f := newFixture(t, db)
		j := f.job("J", "fail", 1)
		fresh, justAlive, stale := f.worker(j), f.worker(j), f.worker(j)
		f.age(50*time.Second, justAlive)
		f.age(70*time.Second, stale)
		fence := models.CleanupFence{StaleAfter: time.Minute}

		out, err := f.q.CleanupWorkers([]uuid.UUID{fresh, justAlive}, fence, lost, models.CleanupAudit{Path: "sweeper"})
		f.must(err)
		if !out.Empty() || !f.exists(fresh) || !f.exists(justAlive) {
			t.Fatalf("staleness fence cleaned %d live workers", len(out.Workers))
		}
		out, err = f.q.CleanupMatching(fence, 10, lost, models.CleanupAudit{Path: "sweeper"})
		f.must(err)
		if len(out.Workers) != 1 || out.Workers[0].ID != stale || f.exists(stale) {
			t.Fatalf("matching cleanup took %d workers, want only %s", len(out.Workers), stale)
		}
		es := f.audit(stale)
		if len(es) != 1 || es[0].ThresholdMs == nil || *es[0].ThresholdMs != time.Minute.Milliseconds() {
			t.Fatalf("audit rows %+v", es)
		}
		if age := es[0].DBNow.Sub(es[0].LastHeartbeat.Time); age < 70*time.Second || age > 2*time.Minute {
			t.Fatalf("audit evidence: db_now - last_heartbeat = %s, want about 70s", age)
		}
		if _, err := f.q.CleanupMatching(models.CleanupFence{}, 10, lost, models.CleanupAudit{Path: "sweeper"}); err == nil {
			t.Fatal("a matching cleanup without staleness or node selected every worker")
		}
	})
}

// Startup recovery's selection: only workers bound to this node by an
// earlier run; not those of this run, of other nodes, or never bound.
func TestCleanupFenceNodeRun(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		f := newFixture(t, db)
		j := f.job("J", "fail", 1)
		earlier, current, otherNode, restOnly := f.worker(j), f.worker(j), f.worker(j), f.worker(j)
		bind := func(w uuid.UUID, node, run string) {
			_, err := f.q.BindWorker(w, node, run)
			f.must(err)
		}
		bind(earlier, "node-a", "run-1")
		bind(current, "node-a", "run-2")
		bind(otherNode, "node-b", "run-1")
		tk := f.task(j)
		if got, ok := f.claim(earlier); !ok || got != tk {
			t.Fatalf("claim %s %v", got, ok)
		}

		out, err := f.q.CleanupMatching(models.CleanupFence{NodeID: "node-a", NodeRun: "run-2"}, 10, lost, models.CleanupAudit{Path: "startup"})
		f.must(err)
		if len(out.Workers) != 1 || out.Workers[0].ID != earlier {
			var got []uuid.UUID
			for _, w := range out.Workers {
				got = append(got, w.ID)
			}
			t.Fatalf("recovery of node-a run-2 cleaned %v, want only %s", got, earlier)
		}
		for _, w := range []uuid.UUID{current, otherNode, restOnly} {
			if !f.exists(w) {
				t.Fatalf("recovery removed %s", w)
			}
		}
		if got := f.get(tk); got.Status != models.StatusFailed || got.Error == nil || *got.Error != lost {
			t.Fatalf("task of the recovered worker: %s %v", got.Status, got.Error)
		}
	})
}

// Cleaning one worker of a job removes only that worker's links: another
// worker of the job stays linked, the job stays live, and it claims.
func TestCleanupKeepsOtherWorkersLinks(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		f := newFixture(t, db)
		j := f.job("J", "fail", 1)
		gone, stays := f.worker(j), f.worker(j)
		out, err := f.q.CleanupWorkers([]uuid.UUID{gone}, models.CleanupFence{}, lost, models.CleanupAudit{Path: "graceful"})
		f.must(err)
		if len(out.Workers) != 1 || len(out.OrphanJobs) != 0 {
			t.Fatalf("cleanup: workers %d, orphaned jobs %+v", len(out.Workers), out.OrphanJobs)
		}
		links, err := f.q.JobWorkerIDs([]uuid.UUID{j.ID})
		f.must(err)
		if ws := links[j.ID]; len(ws) != 1 || ws[0] != stays {
			t.Fatalf("links of the job after cleaning %s: %v, want [%s]", gone, ws, stays)
		}
		tk := f.task(j)
		if got, ok := f.claim(stays); !ok || got != tk {
			t.Fatalf("the remaining worker claimed %s %v, want %s", got, ok, tk)
		}
	})
}

// skewedPostgres opens a fresh PostgreSQL schema whose clock, as every
// statement of joblib sees it, is the real clock plus skew: the schema has
// its own now() and comes before pg_catalog in the search path. The process
// clock is untouched, so the two clocks are apart by skew.
func skewedPostgres(t *testing.T, skew time.Duration) *models.DB {
	t.Helper()
	u, err := url.Parse(dbtest.URL(t, models.Postgres))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	schema := q.Get("search_path")
	q.Set("search_path", schema+",pg_catalog")
	u.RawQuery = q.Encode()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, fmt.Sprintf("CREATE FUNCTION %s.now() RETURNS timestamptz LANGUAGE sql STABLE AS $$ SELECT pg_catalog.now() + interval '%d seconds' $$",
		pgx.Identifier{schema}.Sanitize(), int(skew/time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	db, err := models.Open(ctx, u.String(), models.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	now, err := db.Q(ctx).DBNow()
	if err != nil {
		t.Fatal(err)
	}
	if off := now.Sub(time.Now()); off < skew-time.Minute || off > skew+time.Minute {
		t.Fatalf("database clock is %s off the process clock, want about %s", off, skew)
	}
	return db
}

// skewCases are databases whose clock is an hour ahead of or behind the
// process's (PostgreSQL), and SQLite, which reads the process's clock.
var skewCases = []struct {
	name string
	open func(t *testing.T) *models.DB
}{
	{"postgres-db-ahead", func(t *testing.T) *models.DB { return skewedPostgres(t, time.Hour) }},
	{"postgres-db-behind", func(t *testing.T) *models.DB { return skewedPostgres(t, -time.Hour) }},
	{"sqlite", func(t *testing.T) *models.DB { return dbtest.Open(t, models.SQLite) }},
}

// A skew between the process clock and the database clock changes no
// liveness decision: staleness is judged only against the database's own
// now, by the queries that list, count and clean stale workers.
//
// How the skew is made: on PostgreSQL, by giving the test schema a now()
// an hour ahead of or behind the real one (skewedPostgres), so the database
// clock really differs from the process clock while the process clock is
// left alone. SQLite runs inside the process and reads the process's clock:
// there no skew can exist, and the same decisions are checked without one.
func TestLivenessIgnoresProcessClock(t *testing.T) {
	t.Parallel()
	for _, c := range skewCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db := c.open(t)
			f := newFixture(t, db)
			j := f.job("J", "fail", 1)
			const timeout = time.Minute
			fresh, aging, stale := f.worker(j), f.worker(j), f.worker(j)
			f.age(timeout-10*time.Second, aging)
			f.age(timeout+10*time.Second, stale)

			ids, err := f.q.StaleWorkerIDs(timeout, 10)
			f.must(err)
			if len(ids) != 1 || ids[0] != stale {
				t.Fatalf("stale workers %v, want only %s", ids, stale)
			}
			n, total, err := f.q.CountWorkers(timeout)
			f.must(err)
			if n != 1 || total != 3 {
				t.Fatalf("count: %d stale of %d, want 1 of 3", n, total)
			}
			fence := models.CleanupFence{StaleAfter: timeout}
			out, err := f.q.CleanupWorkers([]uuid.UUID{fresh, aging}, fence, lost, models.CleanupAudit{Path: "sweeper"})
			f.must(err)
			if !out.Empty() {
				t.Fatalf("%d live workers cleaned", len(out.Workers))
			}
			out, err = f.q.CleanupMatching(fence, 10, lost, models.CleanupAudit{Path: "sweeper"})
			f.must(err)
			var cleaned []string
			for _, w := range out.Workers {
				cleaned = append(cleaned, w.ID.String())
			}
			sort.Strings(cleaned)
			if strings.Join(cleaned, ",") != stale.String() || !f.exists(fresh) || !f.exists(aging) {
				t.Fatalf("sweep cleaned %v, want only %s", cleaned, stale)
			}
		})
	}
}
