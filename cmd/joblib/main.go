// Command joblib runs and operates the joblib coordinator.
//
//	joblib serve                       run the coordinator (default)
//	joblib migrate                     apply database migrations and exit
//	joblib token create --user NAME    print a new API token for NAME
//	joblib token list|revoke           list or revoke API tokens
//	joblib audit list                  operator and admin actions
//	joblib sweep [--fix] [--json] [--threshold 90s]
//	                                   show (or, with --fix, clean) stale workers
//	joblib workers list [--json]       list workers with their heartbeat age
//	joblib tasks list [--status S] [--room R] [--json]
//	joblib tasks retry ID              put a failed task back to pending (audited)
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
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], environMap(), os.Stdout, os.Stderr)
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "joblib:", err)
		os.Exit(1)
	}
}

const usage = `usage: joblib <command> [flags]

commands:
  serve                              run the coordinator (default)
  migrate                            apply database migrations and exit
  token create --user NAME [--superuser] [--ttl 720h]
                                     create an API token (and the user if new)
  token list [--user NAME] [--json]  list tokens: id, user, created, last used,
                                     expiry, revocation (never the secret)
  token revoke ID|--user NAME        revoke one token, or every token of a user
  audit list [--action A] [--limit N] [--json]
                                     operator and admin actions, newest first
  sweep [--fix] [--json] [--threshold 90s]
                                     dry run by default: print the stale workers a
                                     sweep would clean and why; --fix cleans them
  workers list [--json] [--limit N]  list workers, heartbeat age and socket binding
  tasks list [--status S] [--room R] [--limit N] [--json]
                                     list tasks, newest first
  tasks retry ID [--actor NAME]      put a failed task back to pending (audited)

Configuration comes from JOBLIB_* environment variables; see README.md.
`

// run is the whole program; main only maps its error to an exit code.
func run(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	cmd := "serve"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	case "serve", "migrate", "token", "sweep", "workers", "tasks", "audit":
	default:
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("unknown command %q", cmd)
	}
	cfg, err := loadConfig(environ)
	if err != nil {
		return err
	}
	log, err := newLogger(cfg, stderr)
	if err != nil {
		return err
	}
	switch cmd {
	case "serve":
		return serve(ctx, cfg, log, stdout)
	case "migrate":
		db, err := openDB(ctx, cfg, log)
		if err != nil {
			return err
		}
		defer db.Close()
		v, err := db.SchemaVersion(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "schema at version %d\n", v)
		return nil
	case "token":
		return tokenCmd(ctx, cfg, log, args, environ, stdout, stderr)
	case "audit":
		return auditCmd(ctx, cfg, log, args, stdout, stderr)
	case "sweep":
		return sweepCmd(ctx, cfg, log, args, stdout, stderr)
	case "workers":
		return workersCmd(ctx, cfg, log, args, stdout, stderr)
	case "tasks":
		return tasksCmd(ctx, cfg, log, args, environ, stdout, stderr)
	}
	return nil
}

func newLogger(cfg Config, w io.Writer) (*slog.Logger, error) {
	level, err := parseLevel(cfg.LogLevel)
	if err != nil {
		return nil, err
	}
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), nil
}

// openDB connects and migrates.
func openDB(ctx context.Context, cfg Config, log *slog.Logger) (*models.DB, error) {
	db, err := models.Open(ctx, cfg.DatabaseURL, models.OpenOptions{Logger: log.With("component", "db")})
	if err != nil {
		return nil, err
	}
	applied, err := db.Migrate(ctx)
	if err != nil {
		db.Close()
		return nil, err
	}
	if len(applied) > 0 {
		log.Info("database migrated", "versions", applied, "dialect", db.Dialect())
	}
	return db, nil
}

const tokenUsage = "usage: joblib token create --user NAME [--superuser] [--ttl 720h] | joblib token list [--user NAME] [--json] | joblib token revoke ID|--user NAME"

func tokenCmd(ctx context.Context, cfg Config, log *slog.Logger, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New(tokenUsage)
	}
	actor := "cli:" + cmp.Or(environ["USER"], "operator")
	switch args[0] {
	case "create":
		fs := flag.NewFlagSet("token create", flag.ContinueOnError)
		fs.SetOutput(stderr)
		user := fs.String("user", "", "user name (created if new)")
		super := fs.Bool("superuser", false, "make the user a superuser")
		ttl := fs.Duration("ttl", 0, "the token expires this long after now (0: never)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *user == "" {
			return errors.New("token create: --user is required")
		}
		if *ttl < 0 {
			return errors.New("token create: --ttl must not be negative")
		}
		svc, closeFn, err := opsService(ctx, cfg, log)
		if err != nil {
			return err
		}
		defer closeFn()
		tok, id, p, err := svc.IssueToken(ctx, joblib.TokenRequest{User: *user, Superuser: *super, TTL: *ttl, Actor: actor})
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, tok)
		log.Info("token created", "token_id", id, "user", p.Name, "user_id", p.ID, "superuser", p.Superuser, "ttl", *ttl)
		return nil
	case "list":
		fs := flag.NewFlagSet("token list", flag.ContinueOnError)
		fs.SetOutput(stderr)
		user := fs.String("user", "", "only this user's tokens")
		asJSON := fs.Bool("json", false, "print JSON")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		svc, closeFn, err := opsService(ctx, cfg, log)
		if err != nil {
			return err
		}
		defer closeFn()
		ts, err := svc.ListTokens(ctx, *user)
		if err != nil {
			return fmt.Errorf("token list: %w", err)
		}
		if *asJSON {
			return json.NewEncoder(stdout).Encode(map[string]any{"items": ts})
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TOKEN ID\tUSER\tNAME\tCREATED\tLAST USED\tEXPIRES\tREVOKED")
		for _, t := range ts {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.User, t.Name, t.CreatedAt.Format(time.RFC3339),
				fmtTime(t.LastUsed), fmtTime(t.ExpiresAt), fmtTime(t.RevokedAt))
		}
		return tw.Flush()
	case "revoke":
		fs := flag.NewFlagSet("token revoke", flag.ContinueOnError)
		fs.SetOutput(stderr)
		user := fs.String("user", "", "revoke every live token of this user")
		rest := args[1:]
		var id string
		if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
			id, rest = rest[0], rest[1:]
		}
		if err := fs.Parse(rest); err != nil {
			return err
		}
		if (id == "") == (*user == "") {
			return errors.New("token revoke: give a token ID or --user NAME (one of them)")
		}
		svc, closeFn, err := opsService(ctx, cfg, log)
		if err != nil {
			return err
		}
		defer closeFn()
		if id != "" {
			tid, err := uuid.Parse(id)
			if err != nil {
				return fmt.Errorf("token revoke: %q is not a token id (see joblib token list)", id)
			}
			t, err := svc.RevokeToken(ctx, tid, actor)
			if err != nil {
				return fmt.Errorf("token revoke: %w", err)
			}
			fmt.Fprintf(stdout, "revoked token %s of user %s\n", t.ID, t.User)
			return nil
		}
		ids, err := svc.RevokeUserTokens(ctx, *user, actor)
		if err != nil {
			return fmt.Errorf("token revoke: %w", err)
		}
		fmt.Fprintf(stdout, "revoked %d token(s) of user %s\n", len(ids), *user)
		return nil
	}
	return errors.New(tokenUsage)
}

func auditCmd(ctx context.Context, cfg Config, log *slog.Logger, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "list" {
		return errors.New("usage: joblib audit list [--action A] [--limit N] [--json]")
	}
	fs := flag.NewFlagSet("audit list", flag.ContinueOnError)
	fs.SetOutput(stderr)
	action := fs.String("action", "", "only entries of this action (task_retry, token_create, token_revoke, job_policy_change, task_status_override)")
	limit := fs.Int("limit", 100, "at most this many entries, newest first")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *limit < 1 {
		return errors.New("audit list: --limit must be positive")
	}
	svc, closeFn, err := opsService(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer closeFn()
	es, err := svc.ListAudit(ctx, *action, *limit)
	if err != nil {
		return fmt.Errorf("audit list: %w", err)
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(map[string]any{"items": es})
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
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

func fmtTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
