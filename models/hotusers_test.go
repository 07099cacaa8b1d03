package models_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// aliceAndBob is a fixture of alice (f.user) with a worker aw on job j, and
// bob, a second user of the same database, with no worker yet.
func aliceAndBob(t *testing.T) (*models.DB, *fixture, *fixture, models.Job, uuid.UUID) {
	t.Helper()
	db := dbtest.Open(t, models.Postgres)
	f := newFixture(t, db)
	u, err := f.q.CreateUser("bob", false)
	f.must(err)
	bob := &fixture{t: t, db: db, q: f.q, user: u.ID}
	j := f.job("Mixed", "fail", 1)
	return db, f, bob, j, f.worker(j)
}

// One batch of status reports carries the reports of several users, and
// checks each against its own user: alice's and bob's reports of the tasks
// their workers hold are applied, whichever comes first in the batch, and a
// report that names a task held by the other user's worker changes nothing
// (the caller's general path then refuses it).
func TestReportBatchChecksEachReportsOwnUser(t *testing.T) {
	t.Parallel()
	db, f, bob, j, aw := aliceAndBob(t)
	ctx := context.Background()
	bw := bob.worker(j)
	for range 4 {
		f.task(j)
	}
	claim := func(w, user uuid.UUID) []uuid.UUID {
		t.Helper()
		owned, ts, err := db.ClaimTasksHot(ctx, w, user, 2, false, models.HotNotify{})
		if err != nil || !owned || len(ts) != 2 {
			t.Fatalf("claim: owned %v, %d tasks, %v", owned, len(ts), err)
		}
		return []uuid.UUID{ts[0].ID, ts[1].ID}
	}
	alices, bobs := claim(aw, f.user), claim(bw, bob.user)

	for _, order := range [][]models.HotUpdate{
		{ // bob's first
			{ID: bobs[0], User: bob.user, Status: models.StatusRunning},
			{ID: alices[0], User: f.user, Status: models.StatusRunning},
			{ID: bobs[1], User: f.user, Status: models.StatusRunning}, // alice, on bob's task
		},
		{ // alice's first
			{ID: alices[1], User: f.user, Status: models.StatusRunning},
			{ID: alices[0], User: bob.user, Status: models.StatusCompleted}, // bob, on alice's task
			{ID: bobs[0], User: bob.user, Status: models.StatusCompleted},
		},
	} {
		got, err := db.UpdateTasksHot(ctx, order, []string{"claimed>running", "running>completed"}, models.HotNotify{})
		f.must(err)
		changed := map[uuid.UUID]string{}
		for _, h := range got {
			changed[h.ID] = h.Status
		}
		want := map[uuid.UUID]string{order[0].ID: order[0].Status}
		if order[0].ID == bobs[0] {
			want[alices[0]] = models.StatusRunning
		} else {
			want[bobs[0]] = models.StatusCompleted
		}
		if len(changed) != len(want) {
			t.Fatalf("batch %v changed %v, want %v", order, changed, want)
		}
		for id, st := range want {
			if changed[id] != st {
				t.Fatalf("batch %v changed %v, want %v", order, changed, want)
			}
		}
	}
	for id, st := range map[uuid.UUID]string{alices[0]: models.StatusRunning, alices[1]: models.StatusRunning, bobs[0]: models.StatusCompleted, bobs[1]: models.StatusClaimed} {
		tk, err := f.q.GetTask(id)
		f.must(err)
		if tk.Status != st {
			t.Errorf("task %s is %s, want %s", id, tk.Status, st)
		}
	}
}

// One group claim carries the claims of several users' workers that serve
// the same jobs: each worker is served for its own user, and a request that
// names another user's worker is left alone (the caller's general path then
// refuses it), wherever it stands in the group.
func TestGroupClaimChecksEachRequestsOwnUser(t *testing.T) {
	t.Parallel()
	db, f, bob, j, aw := aliceAndBob(t)
	ctx := context.Background()
	bw, bw2 := bob.worker(j), bob.worker(j)
	for range 8 {
		f.task(j)
	}
	reqs := []models.ClaimRequest{
		{Worker: bw, User: bob.user, Limit: 2},
		{Worker: bw2, User: f.user, Limit: 1}, // alice, for bob's worker
		{Worker: aw, User: f.user, Limit: 3},
	}
	as, err := db.ClaimGroupHot(ctx, reqs, false, models.HotNotify{})
	f.must(err)
	if len(as) != len(reqs) {
		t.Fatalf("%d answers for %d requests", len(as), len(reqs))
	}
	for i, want := range []struct {
		served bool
		tasks  int
	}{{true, 2}, {false, 0}, {true, 3}} {
		if as[i].Served != want.served || len(as[i].Tasks) != want.tasks {
			t.Errorf("request %d: served %v with %d tasks, want %v with %d", i, as[i].Served, len(as[i].Tasks), want.served, want.tasks)
		}
		for _, tk := range as[i].Tasks {
			if tk.WorkerID == nil || *tk.WorkerID != reqs[i].Worker || tk.Status != models.StatusClaimed {
				t.Errorf("request %d got task %s held by %v (%s)", i, tk.ID, tk.WorkerID, tk.Status)
			}
		}
	}
	var held int
	f.must(db.Pool.QueryRow(ctx, "SELECT count(*) FROM tasks WHERE worker_id = $1", bw2).Scan(&held))
	if held != 0 {
		t.Errorf("bob's second worker holds %d tasks claimed in alice's name", held)
	}
}
