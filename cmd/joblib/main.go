// Command joblib runs and operates the joblib coordinator.
//
//	joblib serve [--listen ADDR]       run the coordinator (default)
//	joblib migrate                     create or upgrade the database and exit
//	joblib token create --user NAME    print a new API token for NAME
//	joblib sweep [--fix] [--json] [--threshold 90s]
//	                                   show (or, with --fix, clean) stale workers
//	joblib workers list [--json]       list workers with their heartbeat age
//	joblib tasks list [--status S] [--room R] [--json]
//	joblib tasks retry ID              put a failed task back to pending (audited)
//	joblib health [--url URL]          probe a running server (container health check)
//	joblib version                     print the version and commit
//
// Every command answers --help; exit status 0 is success, 1 a failure, 2 a
// command line it does not understand.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], environMap(), os.Stdout, os.Stderr)
	stop()
	code := exitCode(err)
	if code == 1 {
		fmt.Fprintln(os.Stderr, "joblib:", err)
	}
	os.Exit(code)
}

// root is the joblib command tree. Operator commands live in ops.go.
func root() *command {
	return &command{
		name: "joblib",
		dflt: "serve",
		subs: []*command{
			serveCommand(),
			migrateCommand(),
			tokenCommand(),
			auditCommand(),
			sweepCommand(),
			workersCommand(),
			tasksCommand(),
			jobsCommand(),
			roomsCommand(),
			healthCommand(),
			versionCommand(),
		},
		long: "Configuration comes from JOBLIB_* environment variables (docs/configuration.md).\n" +
			"Operator commands work on the configured database while servers run.\n",
	}
}

// run is the whole program; main only maps its error to an exit status.
func run(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	if len(args) > 0 && (args[0] == "--version" || args[0] == "-version" || args[0] == "-v") {
		args = append([]string{"version"}, args[1:]...)
	}
	e := &cmdEnv{environ: environ, stdout: stdout, stderr: stderr}
	return dispatch(ctx, root(), "joblib", args, e)
}

func newLogger(cfg Config, w io.Writer) (*slog.Logger, error) {
	level, err := parseLevel(cfg.LogLevel)
	if err != nil {
		return nil, err
	}
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		opts.ReplaceAttr = secondsAttr
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), nil
}

// secondsAttr writes durations in JSON logs as seconds (a number), as log
// pipelines and the configuration's bare numbers expect, not as the
// nanosecond integers slog's JSON handler writes.
func secondsAttr(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.Float64Value(a.Value.Duration().Seconds())
	}
	return a
}
