package models_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// planNode is one node of EXPLAIN (ANALYZE, FORMAT JSON).
type planNode struct {
	Type     string     `json:"Node Type"`
	Relation string     `json:"Relation Name"`
	Index    string     `json:"Index Name"`
	Rows     float64    `json:"Actual Rows"`
	Loops    float64    `json:"Actual Loops"`
	Subplan  string     `json:"Subplan Name"`
	Plans    []planNode `json:"Plans"`
}

func (n planNode) walk(fn func(planNode)) {
	fn(n)
	for _, c := range n.Plans {
		c.walk(fn)
	}
}

func (n planNode) String() string {
	var b strings.Builder
	var rec func(planNode, int)
	rec = func(n planNode, d int) {
		fmt.Fprintf(&b, "%s%s %s %s rows=%.0f loops=%.0f\n", strings.Repeat("  ", d), n.Type, n.Relation, n.Index, n.Rows, n.Loops)
		for _, c := range n.Plans {
			rec(c, d+1)
		}
	}
	rec(n, 0)
	return b.String()
}

// explain runs EXPLAIN ANALYZE of sql inside a transaction that is rolled
// back, so that claims and updates leave nothing behind.
func explain(t *testing.T, db *models.DB, sql string, args ...any) planNode {
	t.Helper()
	p, _ := explainAs(t, db, false, "", sql, args...)
	return p
}

// explainGeneric is explain for the generic plan: the one PostgreSQL caches
// for a prepared statement after five executions, made without the
// parameters' values (pgx prepares every statement it runs).
func explainGeneric(t *testing.T, db *models.DB, sql string, args ...any) planNode {
	t.Helper()
	p, _ := explainAs(t, db, true, "", sql, args...)
	return p
}

// explainAs runs sql in a transaction that is rolled back, after the
// statement pre when given (the planner settings a hot statement runs
// under), and returns its plan with its actual rows and whether the plan
// was compiled by the JIT. The generic plan is forced with plan_cache_mode
// and reported by auto_explain as a notice; the custom one is EXPLAIN
// ANALYZE's.
func explainAs(t *testing.T, db *models.DB, generic bool, pre, sql string, args ...any) (planNode, bool) {
	t.Helper()
	ctx := context.Background()
	cfg := db.Pool.Config().ConnConfig.Copy()
	var notices []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n.Message) }
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if generic {
		for _, s := range []string{"LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0", "SET auto_explain.log_analyze = on",
			"SET auto_explain.log_format = json", "SET auto_explain.log_level = notice", "SET plan_cache_mode = force_generic_plan"} {
			if _, err := conn.Exec(ctx, s); err != nil {
				t.Fatalf("%s: %v", s, err)
			}
		}
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if pre != "" {
		if _, err := tx.Exec(ctx, pre); err != nil {
			t.Fatalf("%s: %v", pre, err)
		}
	}
	type explained struct {
		Plan planNode       `json:"Plan"`
		JIT  map[string]any `json:"JIT"`
	}
	if !generic {
		var raw []byte
		if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+sql, args...).Scan(&raw); err != nil {
			t.Fatalf("explain: %v", err)
		}
		var out []explained
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatal(err)
		}
		return out[0].Plan, out[0].JIT != nil
	}
	notices = nil
	rows, err := tx.Query(ctx, sql, args...)
	if err == nil {
		rows.Close()
		err = rows.Err()
	}
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	for _, m := range notices {
		if _, js, ok := strings.Cut(m, "plan:\n"); ok && strings.Contains(js, `"Query Text": "WITH`) {
			var out explained
			if err := json.Unmarshal([]byte(js), &out); err != nil {
				t.Fatalf("auto_explain's plan: %v", err)
			}
			return out.Plan, out.JIT != nil
		}
	}
	t.Fatalf("no plan among the notices %q", notices)
	return planNode{}, false
}

// tasksRead is how many task rows the plan's nodes on tasks produced (rows
// times loops), and whether any of them sorted or scanned the whole table.
func tasksRead(p planNode) (rows float64, sorts, seqScans int) {
	p.walk(func(n planNode) {
		if n.Relation == "tasks" {
			rows += n.Rows * n.Loops
			if n.Type == "Seq Scan" {
				seqScans++
			}
		}
		if n.Type == "Sort" && n.Rows*n.Loops > 1000 {
			sorts++
		}
	})
	return
}

// jobsRead is what the plan reads of the jobs table: rows and sequential
// scans.
func jobsRead(p planNode) (rows float64, seqScans int) {
	p.walk(func(n planNode) {
		if n.Relation == "jobs" {
			rows += n.Rows * n.Loops
			if n.Type == "Seq Scan" {
				seqScans++
			}
		}
	})
	return
}

// The claim walks an index in order and reads about as many pending rows as
// it claims, with 100,000 pending tasks of mixed priorities and delays in
// the worker's jobs, whether or not the planner has statistics (never a
// sort of the pending rows, never a delayed row); queue positions cost one pass over the pending
// tasks, not one per row of a page. The hot statements read the job of each
// task they change by its key, among a thousand other jobs: the plan cached
// for ten changed tasks once hashed the whole jobs table at every claim and
// report.
func TestPlansAtScale(t *testing.T) {
	t.Parallel()
	db := dbtest.Open(t, models.Postgres)
	ctx := context.Background()
	user, worker, alike := uuid.New(), uuid.New(), uuid.New()
	jobA, jobB := uuid.New(), uuid.New()
	const pending = 100_000
	for _, s := range []string{
		"ALTER TABLE tasks SET (autovacuum_enabled = false)",
		fmt.Sprintf("INSERT INTO users (id, name) VALUES ('%s', 'planner')", user),
		fmt.Sprintf("INSERT INTO workers (id, user_id) VALUES ('%s', '%s'), ('%s', '%s')", worker, user, alike, user),
		fmt.Sprintf("INSERT INTO jobs (id, room_id, category, name) VALUES ('%s', 'r', 'modifiers', 'A'), ('%s', 'r', 'modifiers', 'B')", jobA, jobB),
		"INSERT INTO jobs (id, room_id, category, name) SELECT gen_random_uuid(), 'other' || i, 'modifiers', 'C' FROM generate_series(1, 1000) i",
		fmt.Sprintf("INSERT INTO worker_job_links (worker_id, job_id) VALUES ('%s', '%s'), ('%s', '%s'), ('%s', '%s'), ('%s', '%s')", worker, jobA, worker, jobB, alike, jobA, alike, jobB),
		// The worker's completed history first, then the queue: half in each
		// job, interleaved, in five priorities, a quarter of it delayed by an
		// hour (among them the highest priority's oldest tasks, which a walk
		// that filtered delayed rows would read first).
		fmt.Sprintf(`INSERT INTO tasks (id, job_id, room_id, status, worker_id) SELECT gen_random_uuid(), '%s', 'r', 'completed', '%s' FROM generate_series(1, 5000)`, jobA, worker),
		fmt.Sprintf(`INSERT INTO tasks (id, job_id, room_id, status, priority, delayed, run_at)
			SELECT gen_random_uuid(), CASE WHEN i %% 2 = 0 THEN '%s'::uuid ELSE '%s'::uuid END, 'r', 'pending', i %% 5 - 2,
			i %% 4 = 0 OR i < 20000 AND i %% 5 = 4, CASE WHEN i %% 4 = 0 OR i < 20000 AND i %% 5 = 4 THEN now() + interval '1 hour' END
			FROM generate_series(1, %d) i`, jobA, jobB, pending),
	} {
		if _, err := db.Pool.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	held := make([]uuid.UUID, 10)
	for i := range held {
		held[i] = uuid.New()
		if _, err := db.Pool.Exec(ctx, "INSERT INTO tasks (id, job_id, room_id, status, worker_id) VALUES ($1, $2, 'r', 'running', $3)", held[i], jobA, worker); err != nil {
			t.Fatal(err)
		}
	}
	var last uuid.UUID
	if err := db.Pool.QueryRow(ctx, "SELECT id FROM tasks WHERE job_id = $1 AND status = 'pending' AND NOT delayed ORDER BY seq DESC LIMIT 1", jobA).Scan(&last); err != nil {
		t.Fatal(err)
	}
	for _, stats := range []string{"without statistics", "with statistics"} {
		if stats == "with statistics" {
			if _, err := db.Pool.Exec(ctx, "ANALYZE tasks, jobs"); err != nil {
				t.Fatal(err)
			}
		}
		// The hot statements, with their parameters' values (the plan of
		// the first executions) and without (the plan cached after them);
		// the claims under the planner settings they run with, and never
		// compiled by the JIT.
		for _, plan := range []struct {
			name    string
			generic bool
			explain func(*testing.T, *models.DB, string, ...any) planNode
		}{{"custom plan", false, explain}, {"generic plan", true, explainGeneric}} {
			for _, limit := range []int{1, 10} {
				for _, start := range []bool{false, true} {
					pre := models.ClaimPlanSQL
					if limit > 1 || start {
						pre = models.ClaimGenericPlanSQL
					}
					p, jit := explainAs(t, db, plan.generic, pre, models.ClaimSQL, models.ClaimArgs(worker, user, limit, start, models.HotNotify{}))
					rows, sorts, seq := tasksRead(p)
					if rows > float64(10*limit+10) || sorts > 0 || seq > 0 || jit {
						t.Errorf("claim of %d (start %v) %s, %s: reads %.0f task rows (%d sorts, %d seq scans, JIT %v):\n%s", limit, start, stats, plan.name, rows, sorts, seq, jit, p)
					}
					if rows, seq := jobsRead(p); rows > float64(limit+10) || seq > 0 {
						t.Errorf("claim of %d (start %v) %s, %s: reads %.0f job rows (%d seq scans):\n%s", limit, start, stats, plan.name, rows, seq, p)
					}
				}
			}
			// A group claim of two alike workers reads about as many task rows
			// as it claims, as the single claim does.
			for _, limit := range []int{1, 10} {
				reqs := []models.ClaimRequest{{Worker: worker, User: user, Limit: limit}, {Worker: alike, User: user, Limit: limit}}
				p, jit := explainAs(t, db, plan.generic, models.ClaimGenericPlanSQL, models.ClaimGroupSQL, models.ClaimGroupArgs(reqs, false, models.HotNotify{}))
				if rows, sorts, seq := tasksRead(p); rows > float64(20*limit+10) || sorts > 0 || seq > 0 || jit {
					t.Errorf("group claim of 2 × %d %s, %s: reads %.0f task rows (%d sorts, %d seq scans, JIT %v):\n%s", limit, stats, plan.name, rows, sorts, seq, jit, p)
				}
				if rows, seq := jobsRead(p); rows > float64(2*limit+10) || seq > 0 {
					t.Errorf("group claim of 2 × %d %s, %s: reads %.0f job rows (%d seq scans):\n%s", limit, stats, plan.name, rows, seq, p)
				}
			}
			// A report of one held task, and a batch of ten, read each by its
			// key, not the worker's history.
			for _, n := range []int{1, len(held)} {
				ups := make([]models.HotUpdate, n)
				for i := range n {
					ups[i] = models.HotUpdate{ID: held[i], User: user, Status: "completed"}
				}
				sql, args := models.UpdateArgs(ups, []string{"running>completed"}, models.HotNotify{})
				up := plan.explain(t, db, sql, args)
				if rows, sorts, seq := tasksRead(up); rows < float64(n) || rows > 3*float64(n) || sorts > 0 || seq > 0 {
					t.Errorf("report of %d %s, %s: reads %.0f task rows (%d sorts, %d seq scans):\n%s", n, stats, plan.name, rows, sorts, seq, up)
				}
				if rows, seq := jobsRead(up); rows > float64(n) || seq > 0 {
					t.Errorf("report of %d %s, %s: reads %.0f job rows (%d seq scans):\n%s", n, stats, plan.name, rows, seq, up)
				}
			}
		}
		// A room's newest pending tasks (GET /rooms/r/tasks?status=pending):
		// one ranking pass over the pending tasks of the page's jobs; a count
		// per row would read 50 × 75,000 on average.
		cond := "WHERE t.room_id = $1 AND t.status = 'pending'"
		sql := strings.Replace(models.TasksSelectSQL(cond, "ORDER BY t.created_at DESC, t.seq DESC LIMIT 50 OFFSET 0"), "?", "$1", -1) + "ORDER BY page.created_at DESC, page.seq DESC"
		p := explain(t, db, sql, "r")
		rows, _, seq := tasksRead(p)
		base := explain(t, db, "SELECT t.id FROM tasks t LEFT JOIN jobs j ON j.id = t.job_id "+cond+" ORDER BY t.created_at DESC, t.seq DESC LIMIT 50", "r")
		pageRows, _, pageSeq := tasksRead(base)
		if rows-pageRows > 1.1*pending || seq > pageSeq {
			t.Errorf("the positions of a page of 50 %s read %.0f task rows beyond the page's own %.0f (%d seq scans):\n%s", stats, rows-pageRows, pageRows, seq, p)
		}
		// The idle sweep's deadline read: the first entry of the partial
		// index, not a walk over the held or finished tasks.
		p = explain(t, db, models.EarliestDeadlineSQL)
		if rows, sorts, seq := tasksRead(p); rows > 2 || sorts > 0 || seq > 0 {
			t.Errorf("the earliest deadline %s reads %.0f task rows (%d sorts, %d seq scans):\n%s", stats, rows, sorts, seq, p)
		}
		// The leader's read of the next delayed task: the first entry of
		// tasks_delayed_idx.
		p = explain(t, db, models.NextRunAtSQL)
		if rows, sorts, seq := tasksRead(p); rows > 2 || sorts > 0 || seq > 0 {
			t.Errorf("the next run_at %s reads %.0f task rows (%d sorts, %d seq scans):\n%s", stats, rows, sorts, seq, p)
		}
		// One task's position: a count up to it over the index.
		p = explain(t, db, strings.Replace(models.TaskSelectSQL+"WHERE t.id = ?", "?", "$1", 1), last)
		rows, sorts, seq := tasksRead(p)
		if rows > 0.6*pending || sorts > 0 || seq > 0 {
			t.Errorf("one position %s reads %.0f task rows (%d sorts, %d seq scans):\n%s", stats, rows, sorts, seq, p)
		}
	}
}

// A submission under a quota counts its creator's pending tasks only when the
// user's pending bound leaves no room below the quota: with 2,000 of them
// pending in another job, the statement reads no task row but its own while
// the bound has room, and reads them all when there is no bound or none left
// (the count then decides, and at the quota nothing is inserted). Custom and
// generic plans alike: the count is an initplan that only the CASE's last
// branch evaluates.
func TestSubmitCountsPendingOnlyNearTheQuota(t *testing.T) {
	t.Parallel()
	db := dbtest.Open(t, models.Postgres)
	ctx := context.Background()
	user, other := uuid.New(), uuid.New()
	const backlog = 2000
	for _, s := range []string{
		fmt.Sprintf("INSERT INTO users (id, name) VALUES ('%s', 'submitter')", user),
		fmt.Sprintf("INSERT INTO jobs (id, room_id, category, name) VALUES ('%s', 'r', 'modifiers', 'A'), ('%s', 'r', 'modifiers', 'B')", uuid.New(), other),
		fmt.Sprintf(`INSERT INTO tasks (id, job_id, room_id, status, created_by_id) SELECT gen_random_uuid(), '%s', 'r', 'pending', '%s' FROM generate_series(1, %d)`, other, user, backlog),
	} {
		if _, err := db.Pool.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	inserted := func(p planNode) (n float64) {
		p.walk(func(n2 planNode) {
			if n2.Type == "ModifyTable" && n2.Relation == "tasks" {
				n += n2.Rows * n2.Loops
			}
		})
		return n
	}
	for _, c := range []struct {
		name   string
		bound  any // users.pending_bound
		quota  int
		counts bool
		adds   bool
	}{
		{"no bound", nil, 100_000, true, true},
		{"room in the bound", backlog, 100_000, false, true},
		{"bound at the quota, count below it", backlog, backlog + 1, false, true},
		{"bound at the quota", backlog + 1, backlog + 1, true, true},
		{"count at the quota", backlog, backlog, true, false},
	} {
		if _, err := db.Pool.Exec(ctx, "UPDATE users SET pending_bound = $1 WHERE id = $2", c.bound, user); err != nil {
			t.Fatal(err)
		}
		for _, plan := range []struct {
			name    string
			explain func(*testing.T, *models.DB, string, ...any) planNode
		}{{"custom plan", explain}, {"generic plan", explainGeneric}} {
			p := plan.explain(t, db, models.SubmitSQL, models.SubmitArgs("A", user, c.quota))
			rows, _, seq := tasksRead(p)
			if counted := rows >= backlog; counted != c.counts || seq > 0 {
				t.Errorf("%s, %s: reads %.0f task rows (%d seq scans), want a count: %v:\n%s", c.name, plan.name, rows, seq, c.counts, p)
			}
			if got := inserted(p) == 1; got != c.adds {
				t.Errorf("%s, %s: inserted %v, want %v:\n%s", c.name, plan.name, got, c.adds, p)
			}
		}
	}
}

// A batch report and a batch claim run their cached generic plan from the
// first execution on: PostgreSQL otherwise planned them anew at every
// execution (their array arguments make the generic plan look costlier),
// which cost more than running them (1.1 ms of a 1.8 ms batch report). The
// counts are PostgreSQL's own, per prepared statement of the one connection.
func TestBatchStatementsRunTheirGenericPlan(t *testing.T) {
	t.Parallel()
	db := oneConnection(t)
	ctx := context.Background()
	user, worker, job := uuid.New(), uuid.New(), uuid.New()
	const rounds, batch = 8, 2
	for _, s := range []string{
		fmt.Sprintf("INSERT INTO users (id, name) VALUES ('%s', 'batcher')", user),
		fmt.Sprintf("INSERT INTO workers (id, user_id) VALUES ('%s', '%s')", worker, user),
		fmt.Sprintf("INSERT INTO jobs (id, room_id, category, name) VALUES ('%s', 'r', 'modifiers', 'A')", job),
		fmt.Sprintf("INSERT INTO worker_job_links (worker_id, job_id) VALUES ('%s', '%s')", worker, job),
		fmt.Sprintf(`INSERT INTO tasks (id, job_id, room_id, status) SELECT gen_random_uuid(), '%s', 'r', 'pending' FROM generate_series(1, %d)`, job, rounds*batch),
	} {
		if _, err := db.Pool.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	for range rounds {
		owned, ts, err := db.ClaimTasksHot(ctx, worker, user, batch, false, models.HotNotify{})
		if err != nil || !owned || len(ts) != batch {
			t.Fatalf("claim: owned %v, %d tasks, %v", owned, len(ts), err)
		}
		ups := make([]models.HotUpdate, len(ts))
		for i, tk := range ts {
			ups[i] = models.HotUpdate{ID: tk.ID, User: user, Status: "running"}
		}
		got, err := db.UpdateTasksHot(ctx, ups, []string{"claimed>running"}, models.HotNotify{})
		if err != nil || len(got) != batch {
			t.Fatalf("report: %d changed, %v", len(got), err)
		}
	}
	for _, c := range []struct{ name, like string }{
		{"batch claim", "WITH w AS%"},
		{"batch report", "WITH b AS%unnest%"},
	} {
		var generic, custom int64
		err := db.Pool.QueryRow(ctx, "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE $1", c.like).Scan(&generic, &custom)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if custom != 0 || generic != rounds {
			t.Errorf("%s: %d generic and %d custom plans in %d executions, want only generic ones", c.name, generic, custom, rounds)
		}
	}
}

// Statistics taken while the queue was empty, as on a server with a history
// of finished tasks that autovacuum analysed between two bursts, make every
// index on pending tasks look empty: the planner then judged a walk over all
// of them in the smallest such index, and a sort of the job's rows, as cheap
// as the claim order's own index, and a claim read every pending task
// (30,000 index entries and rows for one claimed task, with 10,000 pending).
// The claims, single, batched and grouped, custom and cached plans alike,
// read about as many task rows as they claim whatever the statistics say.
// They run as the server runs them, and PostgreSQL's own counters of the
// one connection tell the rows read.
func TestClaimsReadLittleUnderStatisticsOfAnEmptyQueue(t *testing.T) {
	t.Parallel()
	db := oneConnection(t)
	ctx := context.Background()
	user, worker, alike := uuid.New(), uuid.New(), uuid.New()
	jobA, jobB := uuid.New(), uuid.New()
	for _, s := range []string{
		"ALTER TABLE tasks SET (autovacuum_enabled = false)",
		fmt.Sprintf("INSERT INTO users (id, name) VALUES ('%s', 'planner')", user),
		fmt.Sprintf("INSERT INTO workers (id, user_id) VALUES ('%s', '%s'), ('%s', '%s')", worker, user, alike, user),
		fmt.Sprintf("INSERT INTO jobs (id, room_id, category, name) VALUES ('%s', 'r', 'modifiers', 'A'), ('%s', 'r', 'modifiers', 'B')", jobA, jobB),
		fmt.Sprintf("INSERT INTO worker_job_links (worker_id, job_id) VALUES ('%s', '%s'), ('%s', '%s'), ('%s', '%s'), ('%s', '%s')", worker, jobA, worker, jobB, alike, jobA, alike, jobB),
		fmt.Sprintf(`INSERT INTO tasks (id, job_id, room_id, status, worker_id, created_by_id) SELECT gen_random_uuid(), '%s', 'r', 'completed', '%s', '%s' FROM generate_series(1, 5000)`, jobA, worker, user),
		"ANALYZE tasks, jobs",
		fmt.Sprintf(`INSERT INTO tasks (id, job_id, room_id, status, created_by_id) SELECT gen_random_uuid(), CASE WHEN i %% 2 = 0 THEN '%s'::uuid ELSE '%s'::uuid END, 'r', 'pending', '%s' FROM generate_series(1, 10000) i`, jobA, jobB, user),
	} {
		if _, err := db.Pool.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	// read is the task rows read so far on this schema: index entries and
	// heap rows of sequential scans. The connection's counters reach the
	// shared view once flushed, which the first statement forces for the
	// second.
	read := func() float64 {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
			t.Fatal(err)
		}
		var n float64
		err := db.Pool.QueryRow(ctx, `SELECT coalesce((SELECT sum(idx_tup_read) FROM pg_stat_user_indexes WHERE schemaname = current_schema() AND relname = 'tasks'), 0)
			+ (SELECT seq_tup_read FROM pg_stat_user_tables WHERE schemaname = current_schema() AND relname = 'tasks')`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	check := func(what string, claimed int, fn func() error) {
		t.Helper()
		before := read()
		if err := fn(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		// A few entries per claimed task, and the entries of the tasks the
		// test claimed before, which the index holds until a vacuum (the
		// walks of a claim pass over at most the hundred or so of them).
		if rows := read() - before; rows > float64(10*claimed+300) {
			t.Errorf("%s: read %.0f task rows to claim %d", what, rows, claimed)
		}
	}
	// Seven single claims: PostgreSQL plans the first five for their
	// values, then may cache a generic plan.
	for i := range 7 {
		check(fmt.Sprintf("single claim %d", i+1), 1, func() error {
			owned, ts, err := db.ClaimTasksHot(ctx, worker, user, 1, false, models.HotNotify{})
			if err == nil && (!owned || len(ts) != 1) {
				err = fmt.Errorf("owned %v, %d tasks", owned, len(ts))
			}
			return err
		})
	}
	for i := range 3 {
		check(fmt.Sprintf("batch claim %d of 10 that starts its tasks", i+1), 10, func() error {
			owned, ts, err := db.ClaimTasksHot(ctx, worker, user, 10, true, models.HotNotify{})
			if err == nil && (!owned || len(ts) != 10) {
				err = fmt.Errorf("owned %v, %d tasks", owned, len(ts))
			}
			return err
		})
		check(fmt.Sprintf("group claim %d of 2 × 10", i+1), 20, func() error {
			as, err := db.ClaimGroupHot(ctx, []models.ClaimRequest{{Worker: worker, User: user, Limit: 10}, {Worker: alike, User: user, Limit: 10}}, false, models.HotNotify{})
			for _, a := range as {
				if err == nil && (!a.Served || len(a.Tasks) != 10) {
					err = fmt.Errorf("served %v, %d tasks", a.Served, len(a.Tasks))
				}
			}
			return err
		})
	}
}

// oneConnection is a migrated PostgreSQL test database behind a pool of one
// connection, so that PostgreSQL's counters of that connection's session
// and prepared statements are the test's statements'.
func oneConnection(t *testing.T) *models.DB {
	t.Helper()
	shared := dbtest.Open(t, models.Postgres)
	db, err := models.Open(context.Background(), shared.URL(), models.OpenOptions{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}
