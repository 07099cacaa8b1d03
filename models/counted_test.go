package models_test

import (
	"context"
	"testing"

	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// During a rolling upgrade a node of the previous version runs its hot
// statements against the current schema: they mark themselves counted in
// their select list, after the count trigger's WHEN clause (schema 180) has
// let the trigger through, and the trigger's function then skips them. A
// status change in that form is counted once, and so is a general-path
// change after it in another transaction.
func TestPreviousVersionsHotStatementIsCountedOnce(t *testing.T) {
	t.Parallel()
	db := dbtest.Open(t, models.Postgres)
	f := newFixture(t, db)
	j := f.job("Upgrade", "fail", 1)
	w := f.worker(j)
	id := f.task(j)
	ctx := context.Background()
	// The previous version's claim, reduced to its counting: the deltas in
	// a CTE and the mark in the select list, projected only once the change
	// is done (there, a hash join read it whole first).
	var marked *string
	err := db.Pool.QueryRow(ctx, `WITH u AS (
	UPDATE tasks SET status = 'claimed', worker_id = $2, claimed_at = now() WHERE id = $1 RETURNING status
), cnt AS (
	INSERT INTO task_count_deltas (status, d) SELECT 'pending', -1 FROM u UNION ALL SELECT status, 1 FROM u
)
SELECT (SELECT set_config('joblib.counted', 'on', true)) FROM (SELECT count(*) FROM u) c`, id, w).Scan(&marked)
	f.must(err)
	expect := func(after string, want map[string]int64) {
		t.Helper()
		counts, err := f.q.CountTasksByStatus()
		f.must(err)
		for st, n := range want {
			if counts[st] != n {
				t.Errorf("after %s: %d %s tasks counted, want %d (%v)", after, counts[st], st, n, counts)
			}
		}
	}
	expect("the previous version's claim", map[string]int64{models.StatusPending: 0, models.StatusClaimed: 1})
	// A change in a later transaction is the trigger's to count.
	_, err = db.Pool.Exec(ctx, `UPDATE tasks SET status = 'failed', completed_at = now() WHERE id = $1`, id)
	f.must(err)
	expect("a general-path change", map[string]int64{models.StatusClaimed: 0, models.StatusFailed: 1})
}
