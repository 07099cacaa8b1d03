package joblib_test

import (
	"context"
	"sync"
	"testing"

	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// Nodes starting together on an empty database, each with its own
// connections, make exactly one first admin between them: one node gets a
// token, the others see that users exist, and none fails.
func TestCreateFirstAdminOnceAmongNodes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.Open(t, models.Postgres)
	const nodes = 8
	svcs := make([]*joblib.Service, nodes)
	for i := range svcs {
		d, err := models.Open(ctx, db.URL(), models.OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		svcs[i] = joblib.New(joblib.Config{DB: d})
		t.Cleanup(svcs[i].Close)
	}
	for round := range 5 {
		if round > 0 {
			if _, err := db.Pool.Exec(ctx, "DELETE FROM api_tokens; DELETE FROM users"); err != nil {
				t.Fatal(err)
			}
		}
		tokens := make([]string, nodes)
		errs := make([]error, nodes)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, s := range svcs {
			wg.Go(func() {
				<-start
				tokens[i], errs[i] = s.CreateFirstAdmin(ctx)
			})
		}
		close(start)
		wg.Wait()
		made := 0
		for i := range nodes {
			if errs[i] != nil {
				t.Fatalf("round %d, node %d: %v", round, i, errs[i])
			}
			if tokens[i] != "" {
				made++
			}
		}
		if made != 1 {
			t.Fatalf("round %d: %d nodes made a first admin, want 1", round, made)
		}
	}
}
