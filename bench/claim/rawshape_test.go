package main

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// TestRawShapes: each -raw-shape runs every task through its changes once,
// every change of the tasks shapes moves an indexed column, and the HOT
// shape's running change is one that PostgreSQL can make as a HOT update, as
// the benchmark claims.
func TestRawShapes(t *testing.T) {
	const tasks = 60
	for _, tc := range []struct {
		shape   string
		running bool // the shape has a running change
		hot     bool // that change is HOT
	}{
		{shape: "narrow"},
		{shape: "tasks"},
		{shape: "tasks3", running: true},
		{shape: "tasks3hot", running: true, hot: true},
		{shape: "state3", running: true},
	} {
		t.Run(tc.shape, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			url := dbtest.URL(t, models.Postgres)
			b, err := newRawBench(ctx, url, options{workers: 4, tasks: tasks, rawShape: tc.shape})
			if err != nil {
				t.Fatal(err)
			}
			r, err := b.round(ctx)
			b.close() // the backends exit and flush their table statistics
			if err != nil {
				t.Fatal(err)
			}
			if r.tasks != tasks || len(r.claims) != tasks {
				t.Fatalf("%d tasks, %d claims; want %d each", r.tasks, len(r.claims), tasks)
			}
			db, err := models.Open(ctx, url, models.OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			var completed, started int
			if err := db.Pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE status = 'completed'), count(started_at) FROM raw_tasks").Scan(&completed, &started); err != nil {
				t.Fatal(err)
			}
			if completed != tasks {
				t.Fatalf("%d tasks completed, want %d", completed, tasks)
			}
			if want := map[bool]int{true: tasks}[tc.running]; started != want {
				t.Fatalf("%d tasks have a running change, want %d", started, want)
			}
			// The table's statistics arrive as its backends exit, each
			// with its own counts.
			wantUpd := int64(tasks) * map[bool]int64{false: 2, true: 3}[tc.running]
			var hot, upd int64
			for deadline := time.Now().Add(20 * time.Second); ; {
				if err := db.Pool.QueryRow(ctx, "SELECT n_tup_hot_upd, n_tup_upd FROM pg_stat_user_tables WHERE relid = 'raw_tasks'::regclass").Scan(&hot, &upd); err != nil {
					t.Fatal(err)
				}
				if upd >= wantUpd || time.Now().After(deadline) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if upd != wantUpd {
				t.Fatalf("%d row updates counted, want %d", upd, wantUpd)
			}
			// A running change is HOT when its page has room for the new
			// version (fillfactor 80 leaves some; a full page moves it).
			if tc.hot && hot < tasks/2 {
				t.Fatalf("%d HOT updates, want most of the %d running changes", hot, tasks)
			}
			if !tc.hot && tc.shape != "narrow" && hot != 0 {
				t.Fatalf("%d HOT updates: every change of this shape moves an indexed column", hot)
			}
		})
	}
}

// TestTasksShapeFollowsSchema: the tasks shapes keep joblib's task table as
// the migrations leave it, so a column or index added there must be added to
// tasksTableDDL too, or the shapes stop measuring joblib's table.
func TestTasksShapeFollowsSchema(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	shape := func(db *models.DB, table string) (cols []string, indexes int) {
		t.Helper()
		rows, err := db.Pool.Query(ctx, "SELECT column_name::text FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = $1 ORDER BY 1", table)
		if err != nil {
			t.Fatal(err)
		}
		cols, err = pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_indexes WHERE schemaname = current_schema() AND tablename = $1", table).Scan(&indexes); err != nil {
			t.Fatal(err)
		}
		return cols, indexes
	}
	jcols, jidx := shape(dbtest.Open(t, models.Postgres), "tasks")

	url := dbtest.URL(t, models.Postgres)
	b, err := newRawBench(ctx, url, options{workers: 1, tasks: 1, rawShape: "tasks3"})
	if err != nil {
		t.Fatal(err)
	}
	b.close()
	raw, err := models.Open(ctx, url, models.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	rcols, ridx := shape(raw, "raw_tasks")

	// joblib's uuid id and unique seq are the shape's bigint id and unique
	// uid; worker is the raw loop's own column.
	want := slices.DeleteFunc(slices.Clone(jcols), func(c string) bool { return c == "seq" })
	want = append(want, "uid", "worker")
	slices.Sort(want)
	if !slices.Equal(rcols, want) {
		t.Errorf("raw tasks shape columns %v, want joblib's tasks columns as %v", rcols, want)
	}
	if ridx != jidx {
		t.Errorf("raw tasks shape has %d indexes, joblib's tasks %d", ridx, jidx)
	}
}
