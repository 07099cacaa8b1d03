package server_test

import (
	"context"
	"sync"
	"testing"

	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// TestPooledConnectionsTerminated: every PostgreSQL backend of the API's pool
// is terminated (pg_terminate_backend, as an operator or a failover does)
// while requests come in. No request answers 500: each either succeeds (a
// transaction that failed on a dead connection before it changed anything
// is retried) or answers 503 database-unavailable with Retry-After. Nothing
// is half done: the tasks that exist are exactly those whose submission
// answered 202, and the API serves normally right after.
func TestPooledConnectionsTerminated(t *testing.T) {
	t.Parallel()
	db := dbtest.Open(t, models.Postgres)
	killer := dbtest.Open(t, models.Postgres) // another session, outside the pool
	e := setup(t, db)
	e.registerJob(e.alice, "pc", "modifiers", "Job")
	ctx := context.Background()
	terminate := func() int {
		t.Helper()
		conns := db.Pool.AcquireAllIdle(ctx)
		var pids []uint32
		for _, c := range conns {
			pids = append(pids, c.Conn().PgConn().PID())
			c.Release()
		}
		for _, pid := range pids {
			if _, err := killer.Pool.Exec(ctx, "SELECT pg_terminate_backend($1)", int(pid)); err != nil {
				t.Fatal(err)
			}
		}
		return len(pids)
	}
	var mu sync.Mutex
	accepted, unavailable, killed := 0, 0, 0
	for range 4 {
		// Several connections in the pool, then all of them terminated.
		var wg sync.WaitGroup
		for range 6 {
			wg.Go(func() { e.do(e.bob, "GET", api+"/rooms/pc/jobs", nil).want(200) })
		}
		wg.Wait()
		killed += terminate()
		for range 6 {
			wg.Go(func() {
				r := e.do(e.bob, "POST", api+"/rooms/pc/tasks/pc:modifiers:Job", map[string]any{"payload": map[string]any{}})
				mu.Lock()
				defer mu.Unlock()
				switch r.Status {
				case 202:
					accepted++
				case 503:
					r.problem(503, "database-unavailable")
					if r.Header.Get("Retry-After") == "" {
						t.Errorf("503 without Retry-After: %s", r.Body)
					}
					unavailable++
				default:
					t.Errorf("submission on a terminated pool answered %d: %s", r.Status, r.Body)
				}
			})
		}
		wg.Wait()
	}
	var n int64
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM tasks").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != int64(accepted) {
		t.Fatalf("%d tasks exist, %d submissions accepted (%d answered 503)", n, accepted, unavailable)
	}
	e.do(e.bob, "POST", api+"/rooms/pc/tasks/pc:modifiers:Job", map[string]any{"payload": map[string]any{}}).want(202)
	t.Logf("%d backends terminated over 4 rounds: %d submissions accepted, %d answered 503", killed, accepted, unavailable)
}
