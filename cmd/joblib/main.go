// Command joblib runs and operates the joblib coordinator.
//
//	joblib serve                       run the coordinator (default)
//	joblib migrate                     apply database migrations and exit
//	joblib token create --user NAME    print a new API token for NAME
//	joblib sweep [--fix] [--json] [--threshold 90s]
//	                                   show (or, with --fix, clean) stale workers
//	joblib workers list [--json]       list workers with their heartbeat age
//	joblib tasks list [--status S] [--room R] [--json]
//	joblib tasks retry ID              put a failed task back to pending (audited)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

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
  token create --user NAME [--superuser]
                                     create an API token (and the user if new)
  sweep [--fix] [--json] [--threshold 90s]
                                     dry run by default: print the stale workers a
                                     sweep would clean and why; --fix cleans them
  workers list [--json] [--limit N]  list workers, heartbeat age and socket binding
  tasks list [--status S] [--room R] [--limit N] [--json]
                                     list tasks, newest first
  tasks retry ID [--actor NAME]      put a failed task back to pending (audited)
  tasks prune [--fix] [--json]       dry run by default: count the finished tasks
                                     past retention; --fix deletes them

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
	case "serve", "migrate", "token", "sweep", "workers", "tasks":
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
		return tokenCmd(ctx, cfg, log, args, stdout, stderr)
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

func tokenCmd(ctx context.Context, cfg Config, log *slog.Logger, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "create" {
		return errors.New("usage: joblib token create --user NAME [--superuser]")
	}
	fs := flag.NewFlagSet("token create", flag.ContinueOnError)
	fs.SetOutput(stderr)
	user := fs.String("user", "", "user name (created if new)")
	super := fs.Bool("superuser", false, "make the user a superuser")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *user == "" {
		return errors.New("token create: --user is required")
	}
	db, err := openDB(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer db.Close()
	svc := joblib.New(joblib.Config{DB: db, Logger: log, Settings: cfg.Settings})
	defer svc.Close()
	tok, p, err := svc.CreateToken(ctx, *user, *super)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, tok)
	log.Info("token created", "user", p.Name, "user_id", p.ID, "superuser", p.Superuser)
	return nil
}
