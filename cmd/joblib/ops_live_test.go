package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
)

// runCLIErr runs a command in-process as operator "ops" and returns its
// output and error.
func runCLIErr(url string, args ...string) (string, string, error) {
	var out, errb bytes.Buffer
	env := map[string]string{"JOBLIB_DATABASE_URL": url, "JOBLIB_LOG_LEVEL": "warn", "USER": "ops"}
	err := run(context.Background(), args, env, &out, &errb)
	return out.String(), errb.String(), err
}

// An operator command against a database a server runs on takes effect in
// that server exactly as the dashboard's action: the removed worker's
// socket is closed, the events reach the UI's socket, the metrics count it,
// and the audit log names the operator. On SQLite no other process could
// reach the server's sockets; on PostgreSQL the metrics and sockets are the
// server's own.
func TestOperatorCommandsReachTheRunningServer(t *testing.T) {
	t.Parallel()
	for _, d := range dbtest.Dialects {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			url := dbtest.URL(t, d)
			token := "jl_ops_" + uuid.NewString()
			// A long worker timeout: the server's own sweeper stays out of it.
			p := startServe(t, "JOBLIB_DATABASE_URL="+url, "JOBLIB_ADMIN_TOKEN="+token, "JOBLIB_WORKER_TIMEOUT=1h")
			base, sioURL := p.base(), "http://"+p.addr
			const room, job = "ops", "ops:modifiers:J"
			newWorker := func() string {
				t.Helper()
				st, _, w := call(t, "POST", base+"/workers", token, map[string]any{})
				if st != 201 {
					t.Fatalf("create worker: %d %v", st, w)
				}
				id := w["id"].(string)
				if st, _, b := call(t, "PUT", base+"/rooms/"+room+"/jobs", token, map[string]any{"category": "modifiers", "name": "J", "schema": map[string]any{}, "worker_id": id}); st != 200 && st != 201 {
					t.Fatalf("register job: %d %v", st, b)
				}
				return id
			}
			ag := startAgent(t)
			ag.connect("ui", sioURL, token)
			ag.emit("ui", "join_room", map[string]any{"room_id": room})
			w1 := newWorker()
			ag.connect("w1", sioURL, token)
			ag.emit("w1", "join_job_room", map[string]any{"job_name": job, "worker_id": w1})
			task := submit(t, base, token, room, job)
			if st, _, c := call(t, "POST", base+"/tasks/claim", token, map[string]any{"worker_id": w1}); st != 200 || c["task"] == nil {
				t.Fatalf("claim: %d %v", st, c)
			}

			// workers delete: the task fails, the socket is closed, the
			// server counts a graceful cleanup.
			out, _, err := runCLIErr(url, "workers", "delete", w1, "--json")
			if err != nil {
				t.Fatalf("workers delete: %v", err)
			}
			var del server.DeleteWorkerResult
			if err := json.Unmarshal([]byte(out), &del); err != nil || del.WorkerID.String() != w1 || del.TasksFailed != 1 || del.OrphanJobs != 1 {
				t.Fatalf("workers delete answered %s (%v)", out, err)
			}
			ag.waitFor("the deleted worker's socket closed", 5*time.Second, func(e agentEvent) bool { return e.Sock == "w1" && e.Event == "$disconnect" })
			ag.waitFor("the UI hears the task failed", 5*time.Second, statusIs("ui", task, "failed"))
			if m := metricLines(t, p, `joblib_workers_cleaned_total{path="graceful"}`); !strings.HasSuffix(m, " 1") {
				t.Fatalf("graceful cleanups counted by the server: %q", m)
			}

			// tasks retry: refused while no worker serves the job (the
			// runbook's case), then through the server once one does.
			if _, _, err := runCLIErr(url, "tasks", "retry", task); err == nil || !strings.Contains(err.Error(), "re-register it before retrying") {
				t.Fatalf("retry of a task whose job lost its last worker: %v", err)
			}
			w2 := newWorker()
			if out, _, err := runCLIErr(url, "tasks", "retry", task, "--json"); err != nil || !strings.Contains(out, `"status":"pending"`) {
				t.Fatalf("tasks retry: %s %v", out, err)
			}
			ag.waitFor("the UI hears the task pending again", 5*time.Second, statusIs("ui", task, "pending"))
			// --server names the server instead of the lease's address.
			if out, _, err := runCLIErr(url, "tasks", "cancel", task, "--json", "--server", sioURL); err != nil || !strings.Contains(out, `"status":"cancelled"`) {
				t.Fatalf("tasks cancel: %s %v", out, err)
			}
			ag.waitFor("the UI hears the task cancelled", 5*time.Second, statusIs("ui", task, "cancelled"))
			// A refusal keeps the server's problem detail.
			if _, _, err := runCLIErr(url, "tasks", "cancel", task); err == nil || !strings.Contains(err.Error(), "(409 invalid-task-transition)") {
				t.Fatalf("second cancel: %v", err)
			}

			// sweep --fix: the stale worker is cleaned by the server (path
			// operator), shown with its owner's name.
			db, err := models.Open(context.Background(), url, models.OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if err := db.Q(context.Background()).SetHeartbeatAge([]uuid.UUID{uuid.MustParse(w2)}, 2*time.Minute); err != nil {
				t.Fatal(err)
			}
			out, _, err = runCLIErr(url, "sweep", "--fix", "--threshold", "30", "--json")
			if err != nil {
				t.Fatal(err)
			}
			var sw server.SweepView
			if err := json.Unmarshal([]byte(out), &sw); err != nil || sw.DryRun || len(sw.Workers) != 1 || sw.Workers[0].ID.String() != w2 || sw.Workers[0].UserName != "admin" {
				t.Fatalf("sweep --fix answered %s (%v)", out, err)
			}
			ag.waitFor("the UI hears the job list changed", 5*time.Second, func(e agentEvent) bool { return e.Sock == "ui" && e.Event == "jobs_invalidate" })
			if m := metricLines(t, p, `joblib_workers_cleaned_total{path="operator"}`); !strings.HasSuffix(m, " 1") {
				t.Fatalf("operator cleanups counted by the server: %q", m)
			}
			if out, errOut, err := runCLIErr(url, "sweep", "--fix", "--threshold", "30"); !strings.Contains(out, "cleaned 0 stale worker(s)") {
				t.Fatalf("second sweep: %s (%v)\n%s", out, err, errOut)
			}

			// The audit log names the operator, not the dashboard.
			out, _, err = runCLIErr(url, "audit", "list", "--json")
			if err != nil {
				t.Fatal(err)
			}
			var audit struct{ Items []joblib.AuditEntry }
			if err := json.Unmarshal([]byte(out), &audit); err != nil {
				t.Fatal(err)
			}
			acted := map[string]string{}
			for _, e := range audit.Items {
				acted[e.Action] = e.Actor
			}
			for _, a := range []string{joblib.AuditWorkerOperatorDelete, joblib.AuditTaskRetry, joblib.AuditTaskCancel} {
				if acted[a] != "cli:ops" {
					t.Errorf("audit of %s: actor %q, want cli:ops (%v)", a, acted[a], acted)
				}
			}
			// The command's own token ended with it.
			ts, err := db.Q(context.Background()).ListAPITokens(nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, tk := range ts {
				if strings.HasPrefix(tk.UserName, joblib.OperatorUserPrefix) && !tk.RevokedAt.Valid() {
					t.Errorf("operator token %s of %s still live", tk.ID, tk.UserName)
				}
			}
		})
	}
}

// A live lease whose node does not answer: the command refuses rather than
// change the database behind a running server's back.
func TestOperatorCommandRefusesWhenTheServerDoesNotAnswer(t *testing.T) {
	t.Parallel()
	for _, d := range dbtest.Dialects {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			url := dbtest.URL(t, d)
			f := seed(t, url)
			db, err := models.Open(context.Background(), url, models.OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if err := db.Q(context.Background()).AcquireNodeLease(uuid.NewString(), "silent", "127.0.0.1:1", time.Minute); err != nil {
				t.Fatal(err)
			}
			_, _, err = runCLIErr(url, "workers", "delete", f.alive.String())
			if err == nil || !strings.Contains(err.Error(), "a server runs on this database but none answered") || !strings.Contains(err.Error(), "--server URL") {
				t.Fatalf("workers delete with a silent server: %v", err)
			}
			if s := snapshot(t, url, f.task); s.Workers != 3 {
				t.Fatalf("the database changed: %+v", s)
			}
		})
	}
}
