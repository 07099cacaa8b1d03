package models_test

import (
	"cmp"
	"context"
	"slices"
	"testing"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// The hot statements answer in the order callers rely on, whatever order
// PostgreSQL returns their rows in: a claim (single or group) hands out its
// tasks by priority, then oldest first, and a batch of reports answers in seq
// order. The tasks' priorities are raised newest first, so that their rows
// lie in the heap, and come out of the statements, in another order.
func TestHotStatementsAnswerInClaimOrder(t *testing.T) {
	t.Parallel()
	db := dbtest.Open(t, models.Postgres)
	ctx := context.Background()
	f := newFixture(t, db)
	queue := func(j models.Job) []uuid.UUID {
		ids := make([]uuid.UUID, 6)
		for i := range ids {
			ids[i] = f.task(j)
		}
		for _, p := range []struct {
			i, priority int
		}{{4, 1}, {3, 2}, {1, 2}} {
			if _, err := db.Pool.Exec(ctx, "UPDATE tasks SET priority = $2 WHERE id = $1", ids[p.i], p.priority); err != nil {
				t.Fatal(err)
			}
		}
		// Claim order: priority 2 (oldest first), 1, then 0.
		return []uuid.UUID{ids[1], ids[3], ids[4], ids[0], ids[2], ids[5]}
	}
	same := func(what string, got []models.HotTask, want []uuid.UUID) {
		t.Helper()
		ids := make([]uuid.UUID, len(got))
		for i, h := range got {
			ids[i] = h.ID
		}
		if len(ids) != len(want) {
			t.Fatalf("%s: %v, want %v", what, ids, want)
		}
		for i := range ids {
			if ids[i] != want[i] {
				t.Fatalf("%s: %v, want %v", what, ids, want)
			}
		}
	}

	a := f.job("OrderA", "fail", 1)
	w := f.worker(a)
	order := queue(a)
	_, got, err := db.ClaimTasksHot(ctx, w, f.user, 6, false, models.HotNotify{})
	f.must(err)
	same("claim", got, order)

	ups := make([]models.HotUpdate, len(order))
	for i, id := range order {
		ups[i] = models.HotUpdate{ID: id, User: f.user, Status: models.StatusRunning}
	}
	reported, err := db.UpdateTasksHot(ctx, ups, []string{"claimed>running"}, models.HotNotify{})
	f.must(err)
	seqOf := map[uuid.UUID]int64{}
	bySeq := make([]uuid.UUID, len(got))
	for i, h := range got {
		seqOf[h.ID], bySeq[i] = h.Seq, h.ID
	}
	slices.SortFunc(bySeq, func(x, y uuid.UUID) int { return cmp.Compare(seqOf[x], seqOf[y]) })
	same("batch report", reported, bySeq)

	b := f.job("OrderB", "fail", 1)
	w1, w2 := f.worker(b), f.worker(b)
	order = queue(b)
	as, err := db.ClaimGroupHot(ctx, []models.ClaimRequest{{Worker: w1, User: f.user, Limit: 3}, {Worker: w2, User: f.user, Limit: 3}}, false, models.HotNotify{})
	f.must(err)
	same("group claim, first worker", as[0].Tasks, order[:3])
	same("group claim, second worker", as[1].Tasks, order[3:])
}
