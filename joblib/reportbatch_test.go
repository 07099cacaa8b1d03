package joblib

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/models"
)

// fakeReports is a reportBatcher's statement: it records each batch, holds
// the first one until released, answers every report but those of absent
// tasks, and fails the batches that hold a task of failing.
type fakeReports struct {
	mu      sync.Mutex
	batches [][]uuid.UUID
	entered chan struct{}
	release chan struct{}
	held    bool
	absent  map[uuid.UUID]bool
	failing map[uuid.UUID]bool
	ctxErrs []error // each batch's context error once it runs
}

func (f *fakeReports) run(ctx context.Context, ups []models.HotUpdate) ([]models.HotTask, error) {
	f.mu.Lock()
	first := !f.held
	f.held = true
	ids := make([]uuid.UUID, len(ups))
	for i, u := range ups {
		ids[i] = u.ID
	}
	f.batches = append(f.batches, ids)
	f.mu.Unlock()
	if first {
		close(f.entered)
		<-f.release
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ctxErrs = append(f.ctxErrs, ctx.Err())
	var out []models.HotTask
	for _, u := range ups {
		if f.failing[u.ID] {
			return nil, errors.New("database gone")
		}
		if !f.absent[u.ID] {
			out = append(out, models.HotTask{Task: models.Task{ID: u.ID, Status: u.Status}})
		}
	}
	return out, nil
}

func (b *reportBatcher) waiting() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if q := b.queues[allReports{}]; q != nil {
		return len(q.waiting)
	}
	return 0
}

// Reports that arrive while one is in the database go out together in the
// next statement, one per task (a second report of a task waits for the
// statement after), each caller gets its own task's answer (none for a task
// the statement did not change, the statement's error for every report in
// a failed one), the queue empties, and a caller that goes away does not
// cancel the statement that carries the others' reports.
func TestReportBatcherGroupsWaitingReports(t *testing.T) {
	f := &fakeReports{entered: make(chan struct{}), release: make(chan struct{}), absent: map[uuid.UUID]bool{}, failing: map[uuid.UUID]bool{}}
	b := newReportBatcher(f.run, nil)
	user := uuid.New()
	ids := make([]uuid.UUID, 6)
	for i := range ids {
		ids[i] = uuid.New()
	}
	f.absent[ids[3]] = true
	type answer struct {
		task *models.HotTask
		err  error
	}
	answers := make([]answer, 8)
	var wg sync.WaitGroup
	call := func(i int, ctx context.Context, id uuid.UUID, status string) {
		wg.Go(func() {
			ht, err := b.report(ctx, models.HotUpdate{ID: id, User: user, Status: status})
			answers[i] = answer{ht, err}
		})
	}
	// The leader's own report is in the database, and its caller gives up.
	leaderCtx, cancelLeader := context.WithCancel(context.Background())
	call(0, leaderCtx, ids[0], "running")
	<-f.entered
	cancelLeader()
	for i := 1; i < 6; i++ {
		call(i, context.Background(), ids[i], "running")
	}
	call(6, context.Background(), ids[1], "completed") // a second report of ids[1]
	for b.waiting() != 6 {
		time.Sleep(time.Millisecond)
	}
	close(f.release)
	wg.Wait()

	// The callers queue in any order: compare each batch as a set.
	sorted := func(ids []uuid.UUID) []uuid.UUID {
		return slices.SortedFunc(slices.Values(ids), func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) })
	}
	want := [][]uuid.UUID{{ids[0]}, sorted(ids[1:6]), {ids[1]}}
	if !slices.EqualFunc(f.batches, want, func(a, b []uuid.UUID) bool { return slices.Equal(sorted(a), b) }) {
		t.Fatalf("batches %v, want %v", f.batches, want)
	}
	for i, err := range f.ctxErrs {
		if err != nil {
			t.Errorf("batch %d ran with a cancelled context: %v", i, err)
		}
	}
	for i, a := range answers[:7] {
		id, status := ids[min(i, 5)], "running"
		if i == 6 {
			id, status = ids[1], "completed"
		}
		switch {
		case a.err != nil:
			t.Errorf("report %d: %v", i, a.err)
		case i == 3 && a.task != nil:
			t.Errorf("report %d of a task the statement did not change got %v", i, a.task.ID)
		case i != 3 && (a.task == nil || a.task.ID != id || a.task.Status != status):
			t.Errorf("report %d: got %+v, want task %s %s", i, a.task, id, status)
		}
	}
	if n := len(b.queues); n != 0 {
		t.Errorf("%d queues left after every report was answered", n)
	}

}

// A statement that fails answers every report in it with its error.
func TestReportBatcherFailedStatement(t *testing.T) {
	boom, other, first := uuid.New(), uuid.New(), uuid.New()
	f := &fakeReports{entered: make(chan struct{}), release: make(chan struct{}), failing: map[uuid.UUID]bool{boom: true}}
	b := newReportBatcher(f.run, nil)
	user := uuid.New()
	errs := make(chan error, 3)
	report := func(id uuid.UUID) {
		go func() {
			_, err := b.report(context.Background(), models.HotUpdate{ID: id, User: user, Status: "completed"})
			errs <- err
		}()
	}
	report(first)
	<-f.entered
	report(boom)
	report(other)
	for b.waiting() != 2 {
		time.Sleep(time.Millisecond)
	}
	close(f.release)
	failed := 0
	for range 3 {
		if err := <-errs; err != nil {
			failed++
		}
	}
	if failed != 2 || len(f.batches) != 2 {
		t.Errorf("%d reports failed in %d statements, want the 2 of the failed second one", failed, len(f.batches))
	}

}

// Many concurrent reporters of several users (600 reports): every report is
// answered with its own task, exactly once, goes out with its own user, no
// statement holds a task twice, statements carry several users' reports
// together, and the lead always passes on (the test would hang).
func TestReportBatcherUnderConcurrency(t *testing.T) {
	var mu sync.Mutex
	owner := map[uuid.UUID]uuid.UUID{}
	var bad []string
	mixed := 0 // statements holding reports of more than one user
	run := func(_ context.Context, ups []models.HotUpdate) ([]models.HotTask, error) {
		mu.Lock()
		seen := map[uuid.UUID]bool{}
		by := map[uuid.UUID]bool{}
		for _, u := range ups {
			if owner[u.ID] != u.User || seen[u.ID] {
				bad = append(bad, fmt.Sprintf("%s sent as %s's, owned by %s (twice: %v)", u.ID, u.User, owner[u.ID], seen[u.ID]))
			}
			seen[u.ID] = true
			by[u.User] = true
		}
		if len(by) > 1 {
			mixed++
		}
		mu.Unlock()
		time.Sleep(200 * time.Microsecond)
		out := make([]models.HotTask, len(ups))
		for i, u := range ups {
			out[i] = models.HotTask{Task: models.Task{ID: u.ID, Status: u.Status}}
		}
		return out, nil
	}
	b := newReportBatcher(run, nil)
	users := []uuid.UUID{uuid.New(), uuid.New(), uuid.New()}
	const perUser, reporters = 100, 12
	type job struct {
		user, task uuid.UUID
	}
	jobs := make(chan job, len(users)*perUser*2)
	for range perUser {
		for _, u := range users { // the users' reports interleaved
			id := uuid.New()
			owner[id] = u
			// Each task reported twice, possibly at once by two reporters.
			jobs <- job{u, id}
			jobs <- job{u, id}
		}
	}
	close(jobs)
	var answered sync.Map
	var wg sync.WaitGroup
	for range reporters {
		wg.Go(func() {
			for j := range jobs {
				ht, err := b.report(context.Background(), models.HotUpdate{ID: j.task, User: j.user, Status: "running"})
				if err != nil || ht == nil || ht.ID != j.task {
					t.Errorf("report of %s: %+v, %v", j.task, ht, err)
					continue
				}
				n, _ := answered.LoadOrStore(j.task, new(int))
				mu.Lock()
				*n.(*int)++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, s := range bad {
		t.Error(s)
	}
	count := 0
	answered.Range(func(_, v any) bool {
		if *v.(*int) != 2 {
			t.Errorf("a task reported twice was answered %d times", *v.(*int))
		}
		count++
		return true
	})
	if count != len(users)*perUser {
		t.Errorf("%d tasks answered, want %d", count, len(users)*perUser)
	}
	if n := len(b.queues); n != 0 {
		t.Errorf("%d queues left", n)
	}
	if mixed == 0 {
		t.Error("no statement carried the reports of two users")
	}
}
