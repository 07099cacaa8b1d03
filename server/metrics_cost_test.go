package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
)

// taskGauges scrapes joblib_tasks{status}.
func taskGauges(t *testing.T, reg *prometheus.Registry) map[string]int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, mf := range mfs {
		if mf.GetName() != "joblib_tasks" {
			continue
		}
		for _, m := range mf.GetMetric() {
			out[m.GetLabel()[0].GetValue()] = int(m.GetGauge().GetValue())
		}
	}
	return out
}

// joblib_tasks{status} is kept incrementally: after bulk inserts, claims,
// completions, cancellations and deletes it equals the true counts on both
// databases, and on PostgreSQL a scrape does not read the tasks table at all
// (it answers while another session holds an exclusive lock on tasks), so
// its cost does not grow with the table.
func TestTaskGaugesAreIncremental(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		reg := prometheus.NewRegistry()
		if _, err := server.NewMetrics(reg, e.svc); err != nil {
			t.Fatal(err)
		}
		w := e.seed()
		ctx := context.Background()
		admin, err := e.db.Q(ctx).UserByName("admin")
		if err != nil {
			t.Fatal(err)
		}
		job := e.do(e.admin, "GET", api+"/rooms/room/jobs/"+rotate, nil).want(200).M()
		// 2,000 tasks in bulk (claimed and running), plus a few by REST.
		if _, err := e.db.Q(ctx).SeedWorkers(admin.ID, uuid.MustParse(job["id"].(string)), 200, 10, 0); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for range 6 {
			ids = append(ids, e.submit(e.admin, "room", rotate, nil))
		}
		c := e.claim(e.admin, w)
		e.patch(e.admin, c["id"].(string), "running").want(200)
		e.patch(e.admin, c["id"].(string), "completed").want(200)
		e.patch(e.admin, ids[5], "cancelled").want(200)

		truth := map[string]int{}
		for _, st := range []string{"pending", "claimed", "running", "completed", "failed", "cancelled"} {
			truth[st] = e.total(api + "/rooms/room/tasks?status=" + st)
		}
		if truth["pending"] != 4 || truth["completed"] != 1 || truth["cancelled"] != 1 {
			t.Fatalf("setup: %v", truth)
		}
		// The seeded tasks (in their own room) are alternately claimed
		// and running.
		truth["claimed"] += 1000
		truth["running"] += 1000
		got := taskGauges(t, reg)
		for st, n := range truth {
			if got[st] != n {
				t.Errorf("joblib_tasks{status=%q} = %d, want %d", st, got[st], n)
			}
		}
		// A second scrape with nothing changed reads the same.
		if again := taskGauges(t, reg); again["claimed"] != 1000 {
			t.Fatalf("second scrape %v", again)
		}
		if e.db.Dialect() != models.Postgres {
			return
		}
		conn, err := pgx.Connect(ctx, e.db.URL())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, "LOCK TABLE tasks IN ACCESS EXCLUSIVE MODE"); err != nil {
			t.Fatal(err)
		}
		done := make(chan map[string]int, 1)
		go func() { done <- taskGauges(t, reg) }()
		select {
		case g := <-done:
			if g["running"] != 1000 {
				t.Fatalf("scrape under lock: %v", g)
			}
		case <-time.After(4 * time.Second): // the collector's own timeout is 5 s
			t.Fatal("a scrape waited for the tasks table: it reads it")
		}
	})
}
