package joblib

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// The sweeper leader runs retention after its sweep; a follower does not.
func TestSweeperPrunesFinishedTasks(t *testing.T) {
	t.Parallel()
	db := dbtest.Open(t, models.SQLite)
	st := DefaultSettings()
	st.WorkerTimeout = 10 * time.Second
	st.SweeperInterval = time.Second
	st.TaskRetentionCompleted = time.Hour
	svc := New(Config{DB: db, Settings: st})
	t.Cleanup(svc.Close)
	ctx := context.Background()
	_, alice, err := svc.CreateToken(ctx, "alice", false)
	if err != nil {
		t.Fatal(err)
	}
	w, err := svc.CreateWorker(ctx, alice)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := svc.RegisterJob(ctx, alice, "r", RegisterJobParams{Category: "modifiers", Name: "a", WorkerID: &w.ID}); err != nil {
		t.Fatal(err)
	}
	cancelled := func() uuid.UUID {
		tk, err := svc.SubmitTask(ctx, alice, "r", "r:modifiers:a", nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := svc.UpdateTask(ctx, alice, tk.ID, models.StatusCancelled, nil); err != nil {
			t.Fatal(err)
		}
		if err := db.Q(ctx).SetTaskCompletedAge([]uuid.UUID{tk.ID}, 2*time.Hour); err != nil {
			t.Fatal(err)
		}
		return tk.ID
	}
	exists := func(id uuid.UUID) bool {
		_, err := db.Q(ctx).GetTask(id)
		return err == nil
	}
	var pruned int64
	svc.OnTasksPruned(func(status string, n int64) {
		if status != models.StatusCancelled {
			t.Errorf("pruned status %s", status)
		}
		pruned += n
	})

	now := time.Unix(1_000_000, 0)
	lead := &fakeLeader{}
	sw := NewSweeper(svc, SweeperConfig{Leader: lead, Now: func() time.Time { return now }})
	sw.healthy, sw.healthySince = true, now
	tick := func(d time.Duration) {
		now = now.Add(d)
		sw.tick(ctx)
	}
	old := cancelled()
	tick(0)
	if !exists(old) {
		t.Fatal("a follower pruned tasks")
	}
	lead.set(true, nil)
	tick(time.Second)
	tick(st.WorkerTimeout)
	if exists(old) || pruned != 1 {
		t.Fatalf("leader's sweep: task exists %v, observed %d pruned", exists(old), pruned)
	}
	// Every interval prunes what has aged since.
	next := cancelled()
	tick(st.SweeperInterval)
	if exists(next) || pruned != 2 {
		t.Fatalf("next interval: task exists %v, observed %d pruned", exists(next), pruned)
	}
}
