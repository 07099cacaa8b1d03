package joblib_test

import (
	"maps"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// finished makes a task in the given status: submitted, and for the others
// claimed and moved on through the state machine.
func (b *bundle) finished(w uuid.UUID, j jobSpec, status string) uuid.UUID {
	b.t.Helper()
	id := b.submit(j)
	if status == models.StatusPending {
		return id
	}
	if status == models.StatusCancelled {
		_, err := b.svc.UpdateTask(b.ctx, b.alice, id, models.StatusCancelled, nil)
		b.must(err)
		return id
	}
	if got := b.claim(w); got != id {
		b.t.Fatalf("claimed %s, want %s", got, id)
	}
	path := map[string][]string{
		models.StatusClaimed:   nil,
		models.StatusRunning:   {models.StatusRunning},
		models.StatusCompleted: {models.StatusRunning, models.StatusCompleted},
		models.StatusFailed:    {models.StatusFailed},
	}[status]
	for _, st := range path {
		_, err := b.svc.UpdateTask(b.ctx, b.alice, id, st, nil)
		b.must(err)
	}
	return id
}

// ageTasks sets completed_at to the database's now minus age (whatever the
// status: live tasks get an old completed_at too, to show that status, not
// the timestamp alone, protects them).
func (b *bundle) ageTasks(age time.Duration, ids ...uuid.UUID) {
	b.t.Helper()
	b.must(b.db.Q(b.ctx).SetTaskCompletedAge(ids, age))
}

func (b *bundle) exists(id uuid.UUID) bool {
	b.t.Helper()
	_, err := b.db.Q(b.ctx).GetTask(id)
	return err == nil
}

// Retention deletes exactly the finished tasks past their status's
// retention, judged by the database's clock: completed and cancelled after
// TaskRetentionCompleted, failed after TaskRetentionFailed, 0 keeps; never
// pending, claimed or running tasks, however old their timestamps. On
// PostgreSQL the pass runs with the process clock at 2000-01-01 (a synctest
// bubble): only the database's clock may decide.
func TestPruneTasksByStatusAndDatabaseClock(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b := setup(t, db, func(s *joblib.Settings) {
			s.TaskRetentionCompleted = time.Hour
			s.TaskRetentionFailed = 3 * time.Hour
			s.TaskRetentionBatch = 2
		})
		j := jobSpec{name: "a"}
		w := b.worker(j)
		type row struct {
			id     uuid.UUID
			status string
			age    time.Duration
			gone   bool
		}
		var rows []row
		add := func(status string, age time.Duration, gone bool) {
			id := b.finished(w, j, status)
			b.ageTasks(age, id)
			rows = append(rows, row{id, status, age, gone})
		}
		add(models.StatusCompleted, 2*time.Hour, true)
		add(models.StatusCompleted, 90*time.Minute, true)
		add(models.StatusCompleted, 61*time.Minute, true)
		add(models.StatusCompleted, 50*time.Minute, false) // young
		add(models.StatusCancelled, 2*time.Hour, true)
		add(models.StatusCancelled, 30*time.Minute, false)
		add(models.StatusFailed, 2*time.Hour, false) // past the completed retention, not the failed one
		add(models.StatusFailed, 4*time.Hour, true)
		add(models.StatusFailed, 170*time.Minute, false)
		add(models.StatusRunning, 100*time.Hour, false)
		add(models.StatusClaimed, 100*time.Hour, false)
		add(models.StatusPending, 100*time.Hour, false)

		dry, err := b.svc.PruneTasks(b.ctx, true)
		b.must(err)
		want := map[string]int64{models.StatusCompleted: 3, models.StatusCancelled: 1, models.StatusFailed: 1}
		if !maps.Equal(dry.Deleted, want) {
			t.Fatalf("dry run counts %v, want %v", dry.Deleted, want)
		}
		for _, r := range rows {
			if !b.exists(r.id) {
				t.Fatalf("dry run deleted a %s task", r.status)
			}
		}

		var rep joblib.PruneReport
		run := func() {
			rep, err = b.svc.PruneTasks(b.ctx, false)
		}
		if db.Dialect() == models.Postgres {
			// The bubble's clock starts at 2000-01-01: a cutoff computed
			// from the process clock would find nothing old enough.
			synctest.Test(t, func(*testing.T) { run() })
		} else {
			run()
		}
		b.must(err)
		if !maps.Equal(rep.Deleted, want) || rep.More {
			t.Fatalf("pruned %v (more %v), want %v", rep.Deleted, rep.More, want)
		}
		// Batches of 2: completed 3 → 2+1, cancelled 1, failed 1.
		if rep.Batches != 4 {
			t.Fatalf("ran %d batches, want 4", rep.Batches)
		}
		for _, r := range rows {
			if b.exists(r.id) == r.gone {
				t.Errorf("%s task aged %s: exists %v, want gone %v", r.status, r.age, !r.gone, r.gone)
			}
		}
		// Nothing left to do: a second pass deletes nothing.
		rep, err = b.svc.PruneTasks(b.ctx, false)
		b.must(err)
		if rep.Total() != 0 {
			t.Fatalf("second pass deleted %v", rep.Deleted)
		}
	})
}

// A retention of 0 keeps that status's tasks forever; the other status is
// still pruned by its own retention.
func TestPruneTasksZeroKeeps(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b := setup(t, db, func(s *joblib.Settings) {
			s.TaskRetentionCompleted = 0
			s.TaskRetentionFailed = time.Hour
		})
		j := jobSpec{name: "a"}
		w := b.worker(j)
		done := b.finished(w, j, models.StatusCompleted)
		canc := b.finished(w, j, models.StatusCancelled)
		fail := b.finished(w, j, models.StatusFailed)
		b.ageTasks(1000*time.Hour, done, canc, fail)
		rep, err := b.svc.PruneTasks(b.ctx, false)
		b.must(err)
		if rep.Total() != 1 || b.exists(fail) || !b.exists(done) || !b.exists(canc) {
			t.Fatalf("completed=0 failed=1h: deleted %v; completed kept %v, cancelled kept %v, failed kept %v",
				rep.Deleted, b.exists(done), b.exists(canc), b.exists(fail))
		}

		b2 := setup(t, dbtest.Open(t, db.Dialect()), func(s *joblib.Settings) {
			s.TaskRetentionCompleted = time.Hour
			s.TaskRetentionFailed = 0
		})
		w = b2.worker(j)
		done = b2.finished(w, j, models.StatusCompleted)
		fail = b2.finished(w, j, models.StatusFailed)
		b2.ageTasks(1000*time.Hour, done, fail)
		rep, err = b2.svc.PruneTasks(b2.ctx, false)
		b2.must(err)
		if rep.Total() != 1 || b2.exists(done) || !b2.exists(fail) {
			t.Fatalf("completed=1h failed=0: deleted %v", rep.Deleted)
		}
	})
}

// One statement deletes at most its batch, oldest first, and refuses a
// status that is not terminal.
func TestPruneTasksBatchesAreBounded(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b := setup(t, db)
		j := jobSpec{name: "a"}
		w := b.worker(j)
		var ids []uuid.UUID
		for i := range 5 {
			id := b.finished(w, j, models.StatusCompleted)
			b.ageTasks(time.Duration(10-i)*time.Hour, id) // ids[0] oldest
			ids = append(ids, id)
		}
		n, err := db.Q(b.ctx).PruneTasks(models.StatusCompleted, time.Hour, 2, models.LeaderFence{})
		b.must(err)
		if n != 2 || b.exists(ids[0]) || b.exists(ids[1]) || !b.exists(ids[2]) {
			t.Fatalf("one batch of 2 deleted %d; the oldest two gone: %v %v", n, !b.exists(ids[0]), !b.exists(ids[1]))
		}
		if _, err := db.Q(b.ctx).PruneTasks(models.StatusPending, time.Hour, 2, models.LeaderFence{}); err == nil {
			t.Fatal("pruning pending tasks was accepted")
		}
		left := slices.DeleteFunc(slices.Clone(ids), func(id uuid.UUID) bool { return !b.exists(id) })
		if len(left) != 3 {
			t.Fatalf("%d left, want 3", len(left))
		}
	})
}
