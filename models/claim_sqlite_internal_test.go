package models

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
)

// On SQLite a claim reads the first entries of tasks_ready_idx of each of
// the worker's jobs, not every pending task of its jobs: the pick over all
// of them read and sorted the whole queue, 13 ms per claim at 20,000
// pending. Its plan probes the index per job in the index's order (no sort
// there, no scan of tasks), and the one sort left orders the few heads; the
// tasks still come in claim order across the jobs, highest priority first,
// then oldest.
func TestSQLiteClaimReadsTheHeadsOfItsJobs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := Open(ctx, filepath.Join(t.TempDir(), "joblib.db"), OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	user, worker, jobA, jobB := uuid.New(), uuid.New(), uuid.New(), uuid.New()
	exec := func(sql string, args ...any) {
		t.Helper()
		if err := db.gorm.Exec(sql, args...).Error; err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec("INSERT INTO users (id, name) VALUES (?, 'u')", user)
	exec("INSERT INTO workers (id, user_id) VALUES (?, ?)", worker, user)
	exec("INSERT INTO jobs (id, room_id, category, name) VALUES (?, 'r', 'modifiers', 'A'), (?, 'r', 'modifiers', 'B')", jobA, jobB)
	exec("INSERT INTO worker_job_links (worker_id, job_id) VALUES (?, ?), (?, ?)", worker, jobA, worker, jobB)
	// The three oldest tasks alternate between the jobs, two thousand more
	// follow in each, then two urgent tasks of A: the claim of five takes
	// the urgent ones, then the three oldest, whatever job they are in.
	add := func(job uuid.UUID, prio, n int) []uuid.UUID {
		t.Helper()
		var ids []uuid.UUID
		for range n {
			id := uuid.New()
			exec("INSERT INTO tasks (id, job_id, room_id, status, priority) VALUES (?, ?, 'r', 'pending', ?)", id, job, prio)
			ids = append(ids, id)
		}
		return ids
	}
	oldest := slices.Concat(add(jobA, 0, 1), add(jobB, 0, 1), add(jobA, 0, 1))
	add(jobB, 0, 2000)
	add(jobA, 0, 2000)
	want := append(add(jobA, 5, 2), oldest...)

	var plan []struct {
		ID, Parent int
		Detail     string
	}
	pick, args := claimPick(SQLite, worker, 5)
	if err := db.gorm.Raw("EXPLAIN QUERY PLAN "+pick, args...).Scan(&plan).Error; err != nil {
		t.Fatal(err)
	}
	var lines []string
	probes, sorts := 0, 0
	for _, p := range plan {
		lines = append(lines, p.Detail)
		switch {
		case strings.HasPrefix(p.Detail, "SCAN t") || strings.HasPrefix(p.Detail, "SCAN p"):
			t.Errorf("the claim scans tasks: %s", p.Detail)
		case strings.Contains(p.Detail, "tasks_ready_idx (job_id=?)"):
			probes++
		case strings.Contains(p.Detail, "TEMP B-TREE"):
			sorts++
			if p.Parent != 0 {
				t.Errorf("the claim sorts inside its per-job probe: %s", p.Detail)
			}
		}
	}
	if probes != 1 || sorts > 1 {
		t.Errorf("want one probe of tasks_ready_idx per job and at most the heads' sort, got plan:\n%s", strings.Join(lines, "\n"))
	}

	ts, err := db.Q(ctx).ClaimTasks(worker, 5, false)
	if err != nil {
		t.Fatal(err)
	}
	var got []uuid.UUID
	for _, tk := range ts {
		got = append(got, tk.ID)
	}
	if len(got) != len(want) {
		t.Fatalf("claimed %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("claimed %v, want %v (urgent first, then the oldest)", got, want)
		}
	}
}
