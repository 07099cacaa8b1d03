package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// opsService opens the configured database (migrating it; safe while a
// server runs) and builds a service over it for an operator command.
func opsService(ctx context.Context, cfg Config, log *slog.Logger) (*joblib.Service, func(), error) {
	db, err := openDB(ctx, cfg, log)
	if err != nil {
		return nil, nil, err
	}
	// On PostgreSQL the command's events (a fixed sweep, a retried task)
	// reach the sockets of the running servers through the NOTIFY bus.
	var bus events.Bus = events.NewLocalBus()
	stopBus := func() {}
	if db.Pool != nil {
		pb := events.NewPGBus(db.Pool, "cli/"+uuid.NewString(), log)
		if err := pb.Start(ctx); err != nil {
			db.Close()
			return nil, nil, err
		}
		bus, stopBus = pb, pb.Stop
	}
	svc := joblib.New(joblib.Config{DB: db, Bus: bus, Logger: log, Settings: cfg.Settings})
	return svc, func() { svc.Close(); stopBus(); db.Close() }, nil
}

// sweepWorker is one worker in `joblib sweep` output.
type sweepWorker struct {
	ID            uuid.UUID   `json:"id"`
	UserID        uuid.UUID   `json:"user_id"`
	LastHeartbeat time.Time   `json:"last_heartbeat"`
	DBNow         time.Time   `json:"db_now"`
	AgeSeconds    float64     `json:"age_seconds"`
	Reason        string      `json:"reason"`
	SessionEpoch  int64       `json:"session_epoch"`
	NodeID        *string     `json:"node_id"`
	NodeRun       *string     `json:"node_run"`
	FailedTasks   []uuid.UUID `json:"failed_tasks"`
	RequeuedTasks []uuid.UUID `json:"requeued_tasks"`
	Providers     int         `json:"providers"`
	OrphanJobs    []string    `json:"orphan_jobs"`
}

type sweepOutput struct {
	SweepID          uuid.UUID     `json:"sweep_id"`
	DryRun           bool          `json:"dry_run"`
	Threshold        string        `json:"threshold"`
	ThresholdSeconds float64       `json:"threshold_seconds"`
	Workers          []sweepWorker `json:"workers"`
	StuckInternal    []uuid.UUID   `json:"stuck_internal_tasks"`
	TasksFailed      int           `json:"tasks_failed"`
	TasksRequeued    int           `json:"tasks_requeued"`
	OrphanJobs       int           `json:"orphan_jobs"`
}

func sweepCmd(ctx context.Context, cfg Config, log *slog.Logger, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sweep", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fix := fs.Bool("fix", false, "clean the stale workers (default: dry run, change nothing)")
	asJSON := fs.Bool("json", false, "print JSON")
	threshold := fs.Duration("threshold", cfg.Settings.WorkerTimeout, "stale = no heartbeat for longer than this, by the database's clock")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *threshold <= 0 {
		return errors.New("sweep: --threshold must be positive")
	}
	svc, closeFn, err := opsService(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer closeFn()
	rep, err := svc.Sweep(ctx, joblib.SweepParams{Path: joblib.PathOperator, Threshold: *threshold, DryRun: !*fix})
	if err != nil {
		return fmt.Errorf("sweep: %w", err)
	}
	out := sweepOutput{SweepID: rep.SweepID, DryRun: rep.DryRun, Threshold: rep.Threshold.String(), ThresholdSeconds: rep.Threshold.Seconds(),
		Workers: []sweepWorker{}, StuckInternal: []uuid.UUID{}, TasksFailed: rep.Result.TasksFailed,
		TasksRequeued: rep.Result.TasksRequeued, OrphanJobs: rep.Result.OrphanJobs}
	for _, w := range rep.Result.Workers {
		age := w.DBNow.Sub(w.LastHeartbeat.Time)
		out.Workers = append(out.Workers, sweepWorker{
			ID: w.ID, UserID: w.UserID, LastHeartbeat: w.LastHeartbeat.UTC(), DBNow: w.DBNow.UTC(), AgeSeconds: age.Seconds(),
			Reason:       fmt.Sprintf("no heartbeat for %s > threshold %s (database clock)", age.Round(time.Millisecond), rep.Threshold),
			SessionEpoch: w.SessionEpoch, NodeID: w.NodeID, NodeRun: w.NodeRun,
			FailedTasks: orEmpty(w.FailedTaskIDs), RequeuedTasks: orEmpty(w.RequeuedTaskIDs), Providers: w.ProvidersGone,
			OrphanJobs: orEmptyS(w.OrphanJobs),
		})
	}
	for _, t := range rep.StuckInternal {
		out.StuckInternal = append(out.StuckInternal, t.ID)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	verb := "would clean"
	if !rep.DryRun {
		verb = "cleaned"
	}
	fmt.Fprintf(stdout, "sweep %s: %s %d stale worker(s) (threshold %s): %d task(s) failed, %d requeued, %d job(s) orphaned; %d stuck internal task(s)\n",
		rep.SweepID, verb, len(out.Workers), rep.Threshold, out.TasksFailed, out.TasksRequeued, out.OrphanJobs, len(out.StuckInternal))
	if len(out.Workers) > 0 {
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "WORKER\tUSER\tLAST HEARTBEAT\tAGE\tNODE\tFAIL\tREQUEUE\tPROVIDERS\tORPHAN JOBS")
		for _, w := range out.Workers {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\n", w.ID, w.UserID, w.LastHeartbeat.Format(time.RFC3339), time.Duration(w.AgeSeconds*float64(time.Second)).Round(time.Second),
				deref(w.NodeID), len(w.FailedTasks), len(w.RequeuedTasks), w.Providers, strings.Join(w.OrphanJobs, ","))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if rep.DryRun && len(out.Workers)+len(out.StuckInternal) > 0 {
		fmt.Fprintln(stdout, "dry run: nothing changed; run with --fix to clean")
	}
	return nil
}

type workerRow struct {
	ID            uuid.UUID `json:"id"`
	UserID        uuid.UUID `json:"user_id"`
	LastHeartbeat time.Time `json:"last_heartbeat"`
	AgeSeconds    float64   `json:"age_seconds"`
	Stale         bool      `json:"stale"`
	SessionEpoch  int64     `json:"session_epoch"`
	NodeID        *string   `json:"node_id"`
	NodeRun       *string   `json:"node_run"`
	JobCount      int64     `json:"job_count"`
}

func workersCmd(ctx context.Context, cfg Config, log *slog.Logger, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "list" {
		return errors.New("usage: joblib workers list [--json] [--limit N]")
	}
	fs := flag.NewFlagSet("workers list", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	limit := fs.Int("limit", 100, "at most this many workers, newest first")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	svc, closeFn, err := opsService(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer closeFn()
	q := svc.DB().Q(ctx)
	now, err := q.DBNow()
	if err != nil {
		return err
	}
	ws, total, err := q.ListWorkers(models.Page{Limit: *limit})
	if err != nil {
		return err
	}
	rows := make([]workerRow, len(ws))
	for i, w := range ws {
		age := now.Sub(w.LastHeartbeat.Time)
		rows[i] = workerRow{ID: w.ID, UserID: w.UserID, LastHeartbeat: w.LastHeartbeat.UTC(), AgeSeconds: age.Seconds(),
			Stale: age > cfg.Settings.WorkerTimeout, SessionEpoch: w.SessionEpoch, NodeID: w.NodeID, NodeRun: w.NodeRun, JobCount: w.JobCount}
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(map[string]any{"total": total, "worker_timeout": cfg.Settings.WorkerTimeout.String(), "items": rows})
	}
	fmt.Fprintf(stdout, "%d worker(s) (showing %d; stale after %s)\n", total, len(rows), cfg.Settings.WorkerTimeout)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKER\tUSER\tLAST HEARTBEAT\tAGE\tSTATE\tEPOCH\tNODE\tJOBS")
	for _, r := range rows {
		state := "alive"
		if r.Stale {
			state = "STALE"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d\n", r.ID, r.UserID, r.LastHeartbeat.Format(time.RFC3339),
			time.Duration(r.AgeSeconds*float64(time.Second)).Round(time.Second), state, r.SessionEpoch, deref(r.NodeID), r.JobCount)
	}
	return tw.Flush()
}

func tasksCmd(ctx context.Context, cfg Config, log *slog.Logger, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	const usage = "usage: joblib tasks list [--status S] [--room R] [--limit N] [--json] | joblib tasks retry ID [--actor NAME] | joblib tasks prune [--fix] [--json]"
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch args[0] {
	case "list":
		fs := flag.NewFlagSet("tasks list", flag.ContinueOnError)
		fs.SetOutput(stderr)
		status := fs.String("status", "", "only tasks in this status")
		room := fs.String("room", "", "only tasks submitted to this room")
		limit := fs.Int("limit", 100, "at most this many tasks, newest first")
		asJSON := fs.Bool("json", false, "print JSON")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *status != "" && !joblib.ValidStatus(*status) {
			return fmt.Errorf("tasks list: --status must be one of pending, claimed, running, completed, failed, cancelled")
		}
		svc, closeFn, err := opsService(ctx, cfg, log)
		if err != nil {
			return err
		}
		defer closeFn()
		ts, total, err := svc.DB().Q(ctx).ListTasks(models.TaskFilter{RoomID: *room, Status: *status}, models.Page{Limit: *limit})
		if err != nil {
			return err
		}
		type taskRow struct {
			ID           uuid.UUID  `json:"id"`
			JobName      string     `json:"job_name"`
			RoomID       string     `json:"room_id"`
			Status       string     `json:"status"`
			Attempt      int        `json:"attempt"`
			WorkerID     *uuid.UUID `json:"worker_id"`
			LostWorkerID *uuid.UUID `json:"lost_worker_id"`
			Error        *string    `json:"error"`
			CreatedAt    time.Time  `json:"created_at"`
		}
		rows := make([]taskRow, len(ts))
		for i, t := range ts {
			rows[i] = taskRow{ID: t.ID, JobName: t.JobFullName(), RoomID: t.RoomID, Status: t.Status, Attempt: t.Attempt,
				WorkerID: t.WorkerID, LostWorkerID: t.LostWorkerID, Error: t.Error, CreatedAt: t.CreatedAt.UTC()}
		}
		if *asJSON {
			return json.NewEncoder(stdout).Encode(map[string]any{"total": total, "items": rows})
		}
		fmt.Fprintf(stdout, "%d task(s) (showing %d)\n", total, len(rows))
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TASK\tJOB\tROOM\tSTATUS\tATTEMPT\tCREATED\tERROR")
		for _, r := range rows {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", r.ID, r.JobName, r.RoomID, r.Status, r.Attempt, r.CreatedAt.Format(time.RFC3339), deref(r.Error))
		}
		return tw.Flush()
	case "retry":
		if len(args) < 2 {
			return errors.New(usage)
		}
		id, err := uuid.Parse(args[1])
		if err != nil {
			return fmt.Errorf("tasks retry: %q is not a task id", args[1])
		}
		fs := flag.NewFlagSet("tasks retry", flag.ContinueOnError)
		fs.SetOutput(stderr)
		actor := fs.String("actor", cmp.Or(environ["USER"], "operator"), "who retries, for the audit log")
		if err := fs.Parse(args[2:]); err != nil {
			return err
		}
		svc, closeFn, err := opsService(ctx, cfg, log)
		if err != nil {
			return err
		}
		defer closeFn()
		t, err := svc.RetryTask(ctx, id, "cli:"+*actor)
		if err != nil {
			return fmt.Errorf("tasks retry %s: %w", id, err)
		}
		fmt.Fprintf(stdout, "task %s is %s again (job %s, room %s, attempt %d so far)\n", t.ID, t.Status, t.JobName, t.RoomID, t.Attempt)
		return nil
	case "prune":
		return tasksPrune(ctx, cfg, log, args[1:], stdout, stderr)
	}
	return errors.New(usage)
}

// tasksPrune is `joblib tasks prune`: what task retention would delete now
// (dry run), or, with --fix, one retention pass.
func tasksPrune(ctx context.Context, cfg Config, log *slog.Logger, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tasks prune", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fix := fs.Bool("fix", false, "delete them (default: dry run, count only)")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	svc, closeFn, err := opsService(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer closeFn()
	rep, err := svc.PruneTasks(ctx, !*fix)
	if err != nil {
		return fmt.Errorf("tasks prune: %w", err)
	}
	st := cfg.Settings
	if *asJSON {
		return json.NewEncoder(stdout).Encode(map[string]any{"dry_run": !*fix, "tasks": rep.Deleted, "more": rep.More,
			"retention_completed": st.TaskRetentionCompleted.String(), "retention_failed": st.TaskRetentionFailed.String()})
	}
	verb := "would delete"
	if *fix {
		verb = "deleted"
	}
	keep := func(d time.Duration) string {
		if d <= 0 {
			return "kept forever"
		}
		return "older than " + d.String()
	}
	fmt.Fprintf(stdout, "%s %d completed, %d cancelled (%s) and %d failed (%s) task(s), by the database's clock\n", verb,
		rep.Deleted[models.StatusCompleted], rep.Deleted[models.StatusCancelled], keep(st.TaskRetentionCompleted),
		rep.Deleted[models.StatusFailed], keep(st.TaskRetentionFailed))
	if rep.More {
		fmt.Fprintln(stdout, "more are left: run again")
	}
	if !*fix && rep.Total() > 0 {
		fmt.Fprintln(stdout, "dry run: nothing changed; run with --fix to delete")
	}
	return nil
}

func orEmpty(ids []uuid.UUID) []uuid.UUID {
	if ids == nil {
		return []uuid.UUID{}
	}
	return ids
}

func orEmptyS(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func deref(s *string) string {
	if s == nil {
		return "-"
	}
	return *s
}
