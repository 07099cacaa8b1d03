package models_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"
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
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var raw []byte
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+sql, args...).Scan(&raw); err != nil {
		t.Fatalf("explain: %v", err)
	}
	var out []struct {
		Plan planNode `json:"Plan"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	return out[0].Plan
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

// The claim walks an index in order and reads about as many pending rows as
// it claims, with 100,000 pending tasks in the worker's jobs, whether or not
// the planner has statistics; queue positions cost one pass over the pending
// tasks, not one per row of a page.
func TestPlansAtScale(t *testing.T) {
	t.Parallel()
	db := dbtest.Open(t, models.Postgres)
	ctx := context.Background()
	user, worker := uuid.New(), uuid.New()
	jobA, jobB := uuid.New(), uuid.New()
	const pending = 100_000
	for _, s := range []string{
		"ALTER TABLE tasks SET (autovacuum_enabled = false)",
		fmt.Sprintf("INSERT INTO users (id, name) VALUES ('%s', 'planner')", user),
		fmt.Sprintf("INSERT INTO workers (id, user_id) VALUES ('%s', '%s')", worker, user),
		fmt.Sprintf("INSERT INTO jobs (id, room_id, category, name) VALUES ('%s', 'r', 'modifiers', 'A'), ('%s', 'r', 'modifiers', 'B')", jobA, jobB),
		fmt.Sprintf("INSERT INTO worker_job_links (worker_id, job_id) VALUES ('%s', '%s'), ('%s', '%s')", worker, jobA, worker, jobB),
		// Completed history first, then the queue: half in each job, interleaved.
		fmt.Sprintf(`INSERT INTO tasks (id, job_id, room_id, status) SELECT gen_random_uuid(), '%s', 'r', 'completed' FROM generate_series(1, 5000)`, jobA),
		fmt.Sprintf(`INSERT INTO tasks (id, job_id, room_id, status) SELECT gen_random_uuid(), CASE WHEN i %% 2 = 0 THEN '%s'::uuid ELSE '%s'::uuid END, 'r', 'pending' FROM generate_series(1, %d) i`, jobA, jobB, pending),
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
	if err := db.Pool.QueryRow(ctx, "SELECT id FROM tasks WHERE job_id = $1 AND status = 'pending' ORDER BY seq DESC LIMIT 1", jobA).Scan(&last); err != nil {
		t.Fatal(err)
	}
	for _, stats := range []string{"without statistics", "with statistics"} {
		if stats == "with statistics" {
			if _, err := db.Pool.Exec(ctx, "ANALYZE tasks"); err != nil {
				t.Fatal(err)
			}
		}
		for _, limit := range []int{1, 10} {
			for _, start := range []bool{false, true} {
				p := explain(t, db, models.ClaimSQL, append(append([]any{worker, user, limit}, models.HotNotify{}.Args()...), start)...)
				rows, sorts, seq := tasksRead(p)
				if rows > float64(10*limit+10) || sorts > 0 || seq > 0 {
					t.Errorf("claim of %d (start %v) %s reads %.0f task rows (%d sorts, %d seq scans):\n%s", limit, start, stats, rows, sorts, seq, p)
				}
			}
		}
		// A batch report of ten held tasks reads each by its key.
		statuses, errs, results := make([]string, len(held)), make([]string, len(held)), make([]*string, len(held))
		for i := range held {
			statuses[i] = "completed"
		}
		up := explain(t, db, models.UpdateBatchSQL, append([]any{held, statuses, errs, results, user, []string{"running>completed"}}, models.HotNotify{}.Args()...)...)
		if rows, sorts, seq := tasksRead(up); rows < float64(len(held)) || rows > 3*float64(len(held)) || sorts > 0 || seq > 0 {
			t.Errorf("batch report of %d %s reads %.0f task rows (%d sorts, %d seq scans):\n%s", len(held), stats, rows, sorts, seq, up)
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
		// One task's position: a count up to it over the index.
		p = explain(t, db, strings.Replace(models.TaskSelectSQL+"WHERE t.id = ?", "?", "$1", 1), last)
		rows, sorts, seq := tasksRead(p)
		if rows > 0.6*pending || sorts > 0 || seq > 0 {
			t.Errorf("one position %s reads %.0f task rows (%d sorts, %d seq scans):\n%s", stats, rows, sorts, seq, p)
		}
	}
}
