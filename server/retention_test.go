package server_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
)

// A client that keeps long-polling a task: while the task runs, the poll
// waits and is answered by the completion; once retention removed the
// finished task, GET /tasks/{id} answers 404 TaskNotFound at once, with or
// without Prefer: wait, as for an unknown task. The deletions are counted
// in joblib_tasks_deleted_total{status}.
func TestPrunedTaskAnswers404(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		e := setup(t, db, withSettings(func(s *joblib.Settings) {
			s.TaskRetentionCompleted = time.Hour
			s.TaskRetentionFailed = time.Hour
		}))
		reg := prometheus.NewRegistry()
		m, err := server.NewMetrics(reg, e.svc)
		if err != nil {
			t.Fatal(err)
		}
		wid := e.newWorker(e.alice)
		e.registerJob(e.alice, "r", "modifiers", "j", map[string]any{"worker_id": wid})
		id := e.submit(e.bob, "r", "r:modifiers:j", nil)
		if got := e.claim(e.alice, wid); got["id"] != id {
			t.Fatalf("claimed %v", got)
		}
		e.patch(e.alice, id, "running").want(200)

		// A long-poll waits on the running task and is answered by its
		// completion.
		var wg sync.WaitGroup
		var polled resp
		wg.Add(1)
		go func() {
			defer wg.Done()
			polled = e.do(e.bob, "GET", api+"/tasks/"+id, nil, "Prefer: wait=30")
		}()
		tid := uuid.MustParse(id)
		waitFor(t, 10*time.Second, func() bool { return e.svc.LongPolls(tid) == 1 })
		e.patch(e.alice, id, "completed").want(200)
		wg.Wait()
		if polled.Status != http.StatusOK || polled.M()["status"] != "completed" {
			t.Fatalf("long-poll answered %d %s", polled.Status, polled.Body)
		}

		if err := db.Q(context.Background()).SetTaskCompletedAge([]uuid.UUID{tid}, 2*time.Hour); err != nil {
			t.Fatal(err)
		}
		rep, err := e.svc.PruneTasks(context.Background(), false)
		if err != nil || rep.Total() != 1 {
			t.Fatalf("prune: %v %v", rep.Deleted, err)
		}
		for _, hdr := range [][]string{nil, {"Prefer: wait=30"}} {
			r := e.do(e.bob, "GET", api+"/tasks/"+id, nil, hdr...)
			p := r.problem(http.StatusNotFound, "task-not-found")
			if p["detail"] != "Task '"+id+"' not found" || r.Header.Get("Preference-Applied") != "" {
				t.Fatalf("removed task with %v: %d %v %v", hdr, r.Status, p, r.Header)
			}
		}
		if n := testCounter(t, m.TasksDeleted.WithLabelValues("completed")); n != 1 {
			t.Fatalf("joblib_tasks_deleted_total{status=completed} = %v", n)
		}
		if n := testCounter(t, m.TasksDeleted.WithLabelValues("failed")); n != 0 {
			t.Fatalf("joblib_tasks_deleted_total{status=failed} = %v", n)
		}
	})
}
