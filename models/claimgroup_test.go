package models_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// A group claim hands each served worker its own tasks, oldest first in the
// order of the requests, and leaves alone the workers it may not serve (not
// the user's, unknown, or serving other jobs than the first worker); its
// tasks are counted and their events written once each.
func TestGroupClaimHandsEachWorkerItsOwnTasks(t *testing.T) {
	t.Parallel()
	db := dbtest.Open(t, models.Postgres)
	f := newFixture(t, db)
	a, b := f.job("GroupA", "fail", 1), f.job("GroupB", "fail", 1)
	var ids []uuid.UUID
	for range 10 {
		ids = append(ids, f.task(a))
	}
	w1, w2, w3 := f.worker(a), f.worker(a), f.worker(a)
	mixed := f.worker(a, b)
	bob, err := f.q.CreateUser("bob", false)
	f.must(err)
	other, err := f.q.InsertWorker(bob.ID)
	f.must(err)
	f.must(f.q.LinkWorkerJob(other.ID, a.ID))
	ghost := uuid.New()
	reqs := []models.ClaimRequest{{Worker: w1, User: f.user, Limit: 2}, {Worker: w2, User: f.user, Limit: 1}, {Worker: mixed, User: f.user, Limit: 1}, {Worker: other.ID, User: f.user, Limit: 1}, {Worker: w3, User: f.user, Limit: 3}, {Worker: ghost, User: f.user, Limit: 1}}
	n := wireFrame(7900)
	as, err := db.ClaimGroupHot(context.Background(), reqs, false, n)
	f.must(err)
	if len(as) != len(reqs) {
		t.Fatalf("%d answers for %d requests", len(as), len(reqs))
	}
	want := map[int][]uuid.UUID{0: ids[0:2], 1: ids[2:3], 4: ids[3:6]}
	for i, r := range reqs {
		got := as[i]
		exp, served := want[i]
		if got.Served != served {
			t.Errorf("request %d: served %v, want %v", i, got.Served, served)
		}
		if len(got.Tasks) != len(exp) {
			t.Errorf("request %d: %d tasks, want %d", i, len(got.Tasks), len(exp))
			continue
		}
		for k, ht := range got.Tasks {
			if ht.ID != exp[k] || ht.Status != models.StatusClaimed || ht.WorkerID == nil || *ht.WorkerID != r.Worker || !ht.Notified || ht.Frame != 9 {
				t.Errorf("request %d task %d: %v status %s worker %v notified %v frame %d, want %v claimed by %v", i, k, ht.ID, ht.Status, ht.WorkerID, ht.Notified, ht.Frame, exp[k], r.Worker)
			}
			if st := f.get(ht.ID); st.Status != models.StatusClaimed || *st.WorkerID != r.Worker {
				t.Errorf("task %v stored as %s by %v", ht.ID, st.Status, st.WorkerID)
			}
		}
	}
	counts, err := f.q.CountTasksByStatus()
	f.must(err)
	if counts[models.StatusPending] != 4 || counts[models.StatusClaimed] != 6 {
		t.Errorf("counts %v, want 4 pending and 6 claimed", counts)
	}
	// One statement, one outbox row: the six events in seq order.
	rows, _ := takeOutbox(t, db)
	if len(rows) != 1 || len(rows[0]) != 6 {
		t.Fatalf("outbox rows %v, want one of 6 events", rows)
	}
	for k, it := range rows[0] {
		if it.P.ID != ids[k] {
			t.Errorf("event %d is task %v's, want %v's", k, it.P.ID, ids[k])
		}
	}
}

// Group claims of random subsets of a fleet and single claims, all at once,
// take every task exactly once, each for the worker it was handed to, and
// the counts stay exact.
func TestGroupClaimsAndSingleClaimsTakeEveryTaskOnce(t *testing.T) {
	t.Parallel()
	db := dbtest.Open(t, models.Postgres)
	f := newFixture(t, db)
	j := f.job("GroupRace", "fail", 1)
	const total = 400
	for range total {
		f.task(j)
	}
	var fleet []uuid.UUID
	for range 8 {
		fleet = append(fleet, f.worker(j))
	}
	var (
		mu    sync.Mutex
		owner = map[uuid.UUID]uuid.UUID{}
		wg    sync.WaitGroup
		errs  = make(chan error, 16)
	)
	take := func(w uuid.UUID, hts []models.HotTask) {
		mu.Lock()
		defer mu.Unlock()
		for _, ht := range hts {
			if prev, dup := owner[ht.ID]; dup {
				t.Errorf("task %v claimed by %v and again by %v", ht.ID, prev, w)
			}
			if ht.WorkerID == nil || *ht.WorkerID != w {
				t.Errorf("task %v handed to %v but claimed for %v", ht.ID, w, ht.WorkerID)
			}
			owner[ht.ID] = w
		}
	}
	ctx := context.Background()
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for empty := 0; empty < 3; {
				var got int
				if g%3 == 0 {
					w := fleet[rng.IntN(len(fleet))]
					_, hts, err := db.ClaimTasksHot(ctx, w, f.user, 1+rng.IntN(3), false, models.HotNotify{})
					if err != nil {
						errs <- err
						return
					}
					take(w, hts)
					got = len(hts)
				} else {
					perm := rng.Perm(len(fleet))[:2+rng.IntN(5)]
					reqs := make([]models.ClaimRequest, len(perm))
					for i, p := range perm {
						reqs[i] = models.ClaimRequest{Worker: fleet[p], User: f.user, Limit: 1 + rng.IntN(3)}
					}
					as, err := db.ClaimGroupHot(ctx, reqs, false, models.HotNotify{})
					if err != nil {
						errs <- err
						return
					}
					for i, a := range as {
						if !a.Served {
							t.Errorf("a worker of the fleet left unserved: %v", reqs[i].Worker)
						}
						take(reqs[i].Worker, a.Tasks)
						got += len(a.Tasks)
					}
				}
				if got == 0 {
					empty++
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(owner) != total {
		t.Errorf("%d tasks claimed, want %d", len(owner), total)
	}
	counts, err := f.q.CountTasksByStatus()
	f.must(err)
	if counts[models.StatusPending] != 0 || counts[models.StatusClaimed] != total {
		t.Errorf("counts %v, want %d claimed and none pending", counts, total)
	}
}
