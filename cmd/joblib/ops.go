package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
)

// openDB opens the configured database and migrates it. Only serve and
// migrate may create one (create); operator commands refuse a database that
// does not exist or never saw joblib's migrations, and log which one they
// opened.
func openDB(ctx context.Context, cfg Config, log *slog.Logger, create bool) (*models.DB, error) {
	where := models.Describe(cfg.DatabaseURL)
	db, err := models.Open(ctx, cfg.DatabaseURL, models.OpenOptions{Logger: log.With("component", "db"), MustExist: !create})
	if err != nil {
		return nil, fmt.Errorf("open database (JOBLIB_DATABASE_URL): %w", err)
	}
	if !create {
		ok, err := db.HasSchema(ctx)
		if err != nil {
			db.Close()
			return nil, err
		}
		if !ok {
			db.Close()
			return nil, fmt.Errorf("open database (JOBLIB_DATABASE_URL): %w at %s (no joblib tables): run `joblib migrate` or `joblib serve` first", models.ErrNoDatabase, where)
		}
	}
	applied, err := db.Migrate(ctx)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate %s: %w", where, err)
	}
	if len(applied) > 0 {
		log.Info("database migrated", "versions", applied, "dialect", db.Dialect(), "database", where)
	}
	if !create {
		log.Info("opened database", "database", where)
	}
	return db, nil
}

// opsService opens the configured database (never creating one; migrating
// it is safe while a server runs) and builds a service over it for an
// operator command.
func opsService(ctx context.Context, cfg Config, log *slog.Logger) (*joblib.Service, func(), error) {
	db, err := openDB(ctx, cfg, log, false)
	if err != nil {
		return nil, nil, err
	}
	// On PostgreSQL the command's events (a fixed sweep, a retried task)
	// reach the sockets of the running servers through the NOTIFY bus.
	var bus events.Bus = events.NewLocalBus()
	stopBus := func() {}
	if db.Caps().Listen {
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

// opsCommand is the shape of an operator leaf command: flags declared in
// setup, then a run with the configuration, a logger and the service over
// the configured (existing) database.
func opsCommand(name, summary string, setup func(fs *flag.FlagSet) func(ctx context.Context, o opsEnv) error) *command {
	return &command{
		name:    name,
		summary: summary,
		setup: func(fs *flag.FlagSet) runFunc {
			body := setup(fs)
			return func(ctx context.Context, e *cmdEnv, args []string) error {
				cfg, log, err := e.config()
				if err != nil {
					return err
				}
				return body(ctx, opsEnv{cfg: cfg, log: log, env: e, args: args})
			}
		},
	}
}

// opsEnv is what an operator command runs with.
type opsEnv struct {
	cfg  Config
	log  *slog.Logger
	env  *cmdEnv
	args []string
}

func (o opsEnv) stdout() io.Writer { return o.env.stdout }

// actor names the operator for the audit log.
func (o opsEnv) actor() string { return "cli:" + cmp.Or(o.env.environ["USER"], "operator") }

// service opens the database and builds a service; call the returned
// function when done.
func (o opsEnv) service(ctx context.Context) (*joblib.Service, func(), error) {
	return opsService(ctx, o.cfg, o.log)
}

func tokenCommand() *command {
	revoke := opsCommand("revoke", "revoke one token, or with --user every live token of a user", func(fs *flag.FlagSet) func(context.Context, opsEnv) error {
		user := fs.String("user", "", "revoke every live token of user `NAME`")
		return func(ctx context.Context, o opsEnv) error {
			id := ""
			if len(o.args) > 0 {
				id = o.args[0]
			}
			if (id == "") == (*user == "") {
				return o.env.usageErr("joblib token revoke", "give a token ID or --user NAME (one of them)")
			}
			var tid uuid.UUID
			if id != "" {
				var err error
				if tid, err = uuid.Parse(id); err != nil {
					return o.env.usageErr("joblib token revoke", "%q is not a token id (see joblib token list)", id)
				}
			}
			svc, closeFn, err := o.service(ctx)
			if err != nil {
				return err
			}
			defer closeFn()
			if id != "" {
				t, err := svc.RevokeToken(ctx, tid, o.actor())
				if err != nil {
					return fmt.Errorf("token revoke: %w", err)
				}
				fmt.Fprintf(o.stdout(), "revoked token %s of user %s\n", t.ID, t.User)
				return nil
			}
			ids, err := svc.RevokeUserTokens(ctx, *user, o.actor())
			if err != nil {
				return fmt.Errorf("token revoke: %w", err)
			}
			fmt.Fprintf(o.stdout(), "revoked %d token(s) of user %s\n", len(ids), *user)
			return nil
		}
	})
	revoke.args, revoke.nargs, revoke.optional = "[ID]", 1, true
	return &command{
		name:    "token",
		summary: "manage API tokens: create, list, revoke",
		subs: []*command{
			opsCommand("create", "create an API token (and the user if new) and print it", func(fs *flag.FlagSet) func(context.Context, opsEnv) error {
				user := fs.String("user", "", "user `NAME` (created if new); required")
				super := fs.Bool("superuser", false, "make the user a superuser")
				ttl := new(time.Duration)
				fs.Var(durationFlag{ttl}, "ttl", "the token expires this long after now, e.g. 720h or 3600 (seconds); 0: never")
				return func(ctx context.Context, o opsEnv) error {
					if *user == "" {
						return o.env.usageErr("joblib token create", "--user is required")
					}
					if *ttl < 0 {
						return o.env.usageErr("joblib token create", "--ttl must not be negative")
					}
					svc, closeFn, err := o.service(ctx)
					if err != nil {
						return err
					}
					defer closeFn()
					tok, id, p, err := svc.IssueToken(ctx, joblib.TokenRequest{User: *user, Superuser: *super, TTL: *ttl, Actor: o.actor()})
					if err != nil {
						return err
					}
					fmt.Fprintln(o.stdout(), tok)
					o.log.Info("token created", "token_id", id, "user", p.Name, "user_id", p.ID, "superuser", p.Superuser, "ttl", *ttl)
					return nil
				}
			}),
			opsCommand("list", "list tokens: id, user, created, last used, expiry, revocation (never the secret)", func(fs *flag.FlagSet) func(context.Context, opsEnv) error {
				user := fs.String("user", "", "only the tokens of user `NAME`")
				asJSON := fs.Bool("json", false, "print JSON")
				return func(ctx context.Context, o opsEnv) error {
					svc, closeFn, err := o.service(ctx)
					if err != nil {
						return err
					}
					defer closeFn()
					ts, err := svc.ListTokens(ctx, *user)
					if err != nil {
						return fmt.Errorf("token list: %w", err)
					}
					if *asJSON {
						return writeJSON(o.stdout(), map[string]any{"items": ts}, false)
					}
					tw := tabwriter.NewWriter(o.stdout(), 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "TOKEN ID\tUSER\tNAME\tCREATED\tLAST USED\tEXPIRES\tREVOKED")
					for _, t := range ts {
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.User, t.Name, t.CreatedAt.Format(time.RFC3339),
							fmtTime(t.LastUsed), fmtTime(t.ExpiresAt), fmtTime(t.RevokedAt))
					}
					return tw.Flush()
				}
			}),
			revoke,
		},
	}
}

func auditCommand() *command {
	return &command{
		name:    "audit",
		summary: "operator and admin actions",
		subs: []*command{
			opsCommand("list", "list audited actions, newest first", func(fs *flag.FlagSet) func(context.Context, opsEnv) error {
				action := fs.String("action", "", "only entries of this action ("+strings.Join(joblib.AuditActions, ", ")+")")
				limit := fs.Int("limit", 100, "at most `N` entries")
				asJSON := fs.Bool("json", false, "print JSON")
				return func(ctx context.Context, o opsEnv) error {
					if *limit < 1 {
						return o.env.usageErr("joblib audit list", "--limit must be positive")
					}
					if *action != "" && !slices.Contains(joblib.AuditActions, *action) {
						return o.env.usageErr("joblib audit list", "--action %q is not an audited action; one of %s", *action, strings.Join(joblib.AuditActions, ", "))
					}
					svc, closeFn, err := o.service(ctx)
					if err != nil {
						return err
					}
					defer closeFn()
					es, err := svc.ListAudit(ctx, *action, *limit)
					if err != nil {
						return fmt.Errorf("audit list: %w", err)
					}
					if *asJSON {
						return writeJSON(o.stdout(), map[string]any{"items": es}, false)
					}
					tw := tabwriter.NewWriter(o.stdout(), 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "TIME\tACTION\tACTOR\tSUBJECT\tDETAIL")
					for _, e := range es {
						subj := "-"
						if e.SubjectID != nil {
							subj = e.SubjectID.String()
						}
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", e.CreatedAt.Format(time.RFC3339), e.Action, e.Actor, subj, e.Detail)
					}
					return tw.Flush()
				}
			}),
		},
	}
}

func fmtTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func sweepCommand() *command {
	return opsCommand("sweep", "show the stale workers a sweep would clean and why (dry run); --fix cleans them", func(fs *flag.FlagSet) func(context.Context, opsEnv) error {
		fix := fs.Bool("fix", false, "clean the stale workers (default: dry run, change nothing); through the running server when there is one")
		asJSON := fs.Bool("json", false, "print JSON")
		threshold := fs.String("threshold", "", "stale = no heartbeat for longer than this, by the database's clock, e.g. 90s or 90 (seconds); at least twice the socket keep-alive (default JOBLIB_WORKER_TIMEOUT)")
		srv := serverFlag(fs)
		return func(ctx context.Context, o opsEnv) error {
			d := time.Duration(0)
			if *threshold != "" {
				var err error
				if d, err = parseDurationValue(*threshold); err != nil || d <= 0 {
					return o.env.usageErr("joblib sweep", "--threshold must be a positive duration, e.g. 90s or 90 (seconds), got %q", *threshold)
				}
			}
			return sweep(ctx, o, *fix, *asJSON, d, *srv)
		}
	})
}

func sweep(ctx context.Context, o opsEnv, fix, asJSON bool, threshold time.Duration, serverURL string) error {
	stdout := o.stdout()
	if threshold == 0 {
		threshold = o.cfg.Settings.WorkerTimeout
	}
	keepAlive := server.KeepAliveInterval(o.cfg.Realtime, o.cfg.Settings.WorkerTimeout)
	if err := joblib.CheckSweepThreshold(threshold, keepAlive); err != nil {
		e, _ := joblib.AsError(err)
		return o.env.usageErr("joblib sweep", "%s (the keep-alive interval is JOBLIB_SOCKET_KEEPALIVE_INTERVAL)", e.Detail)
	}
	svc, closeFn, err := o.service(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	var out server.SweepView
	err = errNoServer
	if fix {
		secs := threshold.Seconds()
		err = o.viaServer(ctx, svc, serverURL, o.operatorName(""), http.MethodPost, "/dashboard/sweep", server.SweepRequest{ThresholdSeconds: &secs}, &out)
	}
	if errors.Is(err, errNoServer) {
		var rep joblib.SweepReport
		rep, err = svc.Sweep(ctx, joblib.SweepParams{Path: joblib.PathOperator, Threshold: threshold, DryRun: !fix})
		if err == nil {
			var owners map[uuid.UUID]string
			owners, err = server.SweepOwners(ctx, svc, rep)
			out = server.NewSweepView(rep, owners)
		}
	}
	if err != nil {
		return fmt.Errorf("sweep: %w", err)
	}
	if asJSON {
		return writeJSON(stdout, out, true)
	}
	verb := "would clean"
	if !out.DryRun {
		verb = "cleaned"
	}
	fmt.Fprintf(stdout, "sweep %s: %s %d stale worker(s) (threshold %s): %d task(s) failed, %d requeued, %d job(s) orphaned; %d stuck internal task(s)\n",
		out.SweepID, verb, len(out.Workers), out.Threshold, out.TasksFailed, out.TasksRequeued, out.OrphanJobs, len(out.StuckInternal))
	if len(out.Workers) > 0 {
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "WORKER\tUSER\tLAST HEARTBEAT\tAGE\tNODE\tFAIL\tREQUEUE\tPROVIDERS\tORPHAN JOBS")
		for _, w := range out.Workers {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\n", w.ID, cmp.Or(w.UserName, "-"), w.LastHeartbeat.Format(time.RFC3339), time.Duration(w.AgeSeconds*float64(time.Second)).Round(time.Second),
				deref(w.NodeID), len(w.FailedTasks), len(w.RequeuedTasks), w.Providers, strings.Join(w.OrphanJobs, ","))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if out.DryRun && len(out.Workers)+len(out.StuckInternal) > 0 {
		fmt.Fprintln(stdout, "dry run: nothing changed; run with --fix to clean")
	}
	return nil
}

type workerRow struct {
	ID            uuid.UUID `json:"id"`
	UserID        uuid.UUID `json:"user_id"`
	UserName      string    `json:"user_name"`
	LastHeartbeat time.Time `json:"last_heartbeat"`
	AgeSeconds    float64   `json:"age_seconds"`
	Stale         bool      `json:"stale"`
	SessionEpoch  int64     `json:"session_epoch"`
	NodeID        *string   `json:"node_id"`
	NodeRun       *string   `json:"node_run"`
	JobCount      int64     `json:"job_count"`
}

func workersCommand() *command {
	return &command{
		name:    "workers",
		summary: "inspect and delete workers",
		subs: []*command{
			opsCommand("list", "list workers, newest first: owner, heartbeat age by the database clock, socket binding", func(fs *flag.FlagSet) func(context.Context, opsEnv) error {
				asJSON := fs.Bool("json", false, "print JSON")
				limit := fs.Int("limit", 100, "at most `N` workers")
				return func(ctx context.Context, o opsEnv) error {
					return listWorkers(ctx, o, *asJSON, *limit)
				}
			}),
			deleteWorkerCommand(),
		},
	}
}

func listWorkers(ctx context.Context, o opsEnv, asJSON bool, limit int) error {
	if limit < 0 {
		return o.env.usageErr("joblib workers list", "--limit must not be negative")
	}
	svc, closeFn, err := o.service(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	q := svc.DB().Q(ctx)
	now, err := q.DBNow()
	if err != nil {
		return err
	}
	ws, total, err := q.ListWorkers(models.Page{Limit: limit})
	if err != nil {
		return err
	}
	names := map[uuid.UUID]string{}
	timeout := o.cfg.Settings.WorkerTimeout
	rows := make([]workerRow, len(ws))
	for i, w := range ws {
		name, ok := names[w.UserID]
		if !ok {
			u, err := q.UserByID(w.UserID)
			switch {
			case err == nil:
				name = u.Name
			case errors.Is(err, models.ErrNotFound):
				name = "-"
			default:
				return err
			}
			names[w.UserID] = name
		}
		age := now.Sub(w.LastHeartbeat.Time)
		rows[i] = workerRow{ID: w.ID, UserID: w.UserID, UserName: name, LastHeartbeat: w.LastHeartbeat.UTC(), AgeSeconds: age.Seconds(),
			Stale: age > timeout, SessionEpoch: w.SessionEpoch, NodeID: w.NodeID, NodeRun: w.NodeRun, JobCount: w.JobCount}
	}
	stdout := o.stdout()
	if asJSON {
		return writeJSON(stdout, map[string]any{"total": total, "worker_timeout": timeout.String(), "items": rows}, false)
	}
	fmt.Fprintf(stdout, "%d worker(s) (showing %d; stale after %s)\n", total, len(rows), timeout)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKER\tUSER\tLAST HEARTBEAT\tAGE\tSTATE\tEPOCH\tNODE\tJOBS")
	for _, r := range rows {
		state := "alive"
		if r.Stale {
			state = "STALE"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d\n", r.ID, r.UserName, r.LastHeartbeat.Format(time.RFC3339),
			time.Duration(r.AgeSeconds*float64(time.Second)).Round(time.Second), state, r.SessionEpoch, deref(r.NodeID), r.JobCount)
	}
	return tw.Flush()
}

func tasksCommand() *command {
	return &command{
		name:    "tasks",
		summary: "inspect, retry and cancel tasks",
		subs: []*command{
			opsCommand("list", "list tasks, newest first", func(fs *flag.FlagSet) func(context.Context, opsEnv) error {
				status := fs.String("status", "", "only tasks in this status (pending, claimed, running, completed, failed, cancelled)")
				room := fs.String("room", "", "only tasks submitted to this room")
				limit := fs.Int("limit", 100, "at most `N` tasks")
				asJSON := fs.Bool("json", false, "print JSON")
				return func(ctx context.Context, o opsEnv) error {
					return listTasks(ctx, o, *status, *room, *limit, *asJSON)
				}
			}),
			retryCommand(),
			cancelCommand(),
			pruneCommand(),
		},
	}
}

func listTasks(ctx context.Context, o opsEnv, status, room string, limit int, asJSON bool) error {
	if status != "" && !joblib.ValidStatus(status) {
		return o.env.usageErr("joblib tasks list", "--status must be one of pending, claimed, running, completed, failed, cancelled")
	}
	if limit < 0 {
		return o.env.usageErr("joblib tasks list", "--limit must not be negative")
	}
	svc, closeFn, err := o.service(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	ts, total, err := svc.DB().Q(ctx).ListTasks(models.TaskFilter{RoomID: room, Status: status}, models.Page{Limit: limit})
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
	stdout := o.stdout()
	if asJSON {
		return writeJSON(stdout, map[string]any{"total": total, "items": rows}, false)
	}
	fmt.Fprintf(stdout, "%d task(s) (showing %d)\n", total, len(rows))
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TASK\tJOB\tROOM\tSTATUS\tATTEMPT\tCREATED\tERROR")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", r.ID, r.JobName, r.RoomID, r.Status, r.Attempt, r.CreatedAt.Format(time.RFC3339), deref(r.Error))
	}
	return tw.Flush()
}

func retryCommand() *command {
	return operatorAction(operatorActionSpec[joblib.Task]{
		name: "retry", path: "joblib tasks retry", what: "task", summary: "put a failed task back to pending, as the dashboard does (audited)",
		method: http.MethodPost, endpoint: func(id uuid.UUID) string { return "/dashboard/tasks/" + id.String() + "/retry" },
		local: func(ctx context.Context, svc *joblib.Service, id uuid.UUID, actor string) (joblib.Task, error) {
			return svc.RetryTask(ctx, id, actor)
		},
		print: func(w io.Writer, t joblib.Task) {
			fmt.Fprintf(w, "task %s is %s again (job %s, room %s, attempt %d so far)\n", t.ID, t.Status, t.JobName, t.RoomID, t.Attempt)
		},
	})
}

// pruneCommand is `joblib tasks prune`: what task retention would delete now
// (dry run), or, with --fix, one retention pass.
func pruneCommand() *command {
	return opsCommand("prune", "count the finished tasks past retention; --fix deletes them", func(fs *flag.FlagSet) func(context.Context, opsEnv) error {
		fix := fs.Bool("fix", false, "delete them (default: dry run, count only)")
		asJSON := fs.Bool("json", false, "print JSON")
		return func(ctx context.Context, o opsEnv) error {
			svc, closeFn, err := o.service(ctx)
			if err != nil {
				return err
			}
			defer closeFn()
			rep, err := svc.PruneTasks(ctx, !*fix)
			if err != nil {
				return fmt.Errorf("tasks prune: %w", err)
			}
			st := o.cfg.Settings
			stdout := o.stdout()
			if *asJSON {
				return writeJSON(stdout, map[string]any{"dry_run": !*fix, "tasks": rep.Deleted, "more": rep.More,
					"retention_completed": st.TaskRetentionCompleted.String(), "retention_failed": st.TaskRetentionFailed.String()}, false)
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
	})
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
