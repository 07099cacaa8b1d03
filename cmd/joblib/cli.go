package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"
)

// command is one node of the joblib command tree: either a group of
// subcommands (subs) or a leaf that runs (setup). Every level answers
// --help on stdout with exit status 0 and does nothing else; an unknown
// flag or command is a usage error (exit status 2) naming it.
type command struct {
	name    string
	summary string // one line, shown in the parent's listing
	// args is the synopsis of the positional arguments, e.g. "ID".
	args string
	// nargs is the exact number of positional arguments a leaf takes (the
	// most it takes when optional is set).
	nargs    int
	optional bool
	// setup declares the leaf's flags on fs and returns the function that
	// runs the command once they are parsed. Flags and positional
	// arguments may be given in any order.
	setup func(fs *flag.FlagSet) runFunc
	subs  []*command
	// dflt, on a group, is the subcommand run when none is named.
	dflt string
	// long is extra help text printed after the flags.
	long string
	// raw hands every argument to the runFunc of setup unparsed (setup gets
	// an empty flag set): for a command that parses its own subcommands
	// and flags. Prefer leaves with flags.
	raw bool
}

// runFunc runs a leaf command with its positional arguments.
type runFunc func(ctx context.Context, e *cmdEnv, args []string) error

// cmdEnv is what a command may use: the process environment and streams,
// and the configuration, loaded (and validated) on first use so that
// --help works even with a broken environment.
type cmdEnv struct {
	environ        map[string]string
	stdout, stderr io.Writer

	loaded bool
	cfg    Config
	log    *slog.Logger
	err    error
}

// config returns the validated configuration and a logger writing to
// stderr. Unknown JOBLIB_ variables are warned about once.
func (e *cmdEnv) config() (Config, *slog.Logger, error) {
	if !e.loaded {
		e.loaded = true
		e.cfg, e.err = loadConfig(e.environ)
		if e.err == nil {
			e.log, e.err = newLogger(e.cfg, e.stderr)
		}
		warn := e.log
		if warn == nil { // the configuration is broken: warn in plain text
			warn = slog.New(slog.NewTextHandler(e.stderr, nil))
		}
		_, aliases := resolveAliases(e.environ)
		for _, w := range append(aliases, unknownVariables(e.environ)...) {
			warn.Warn(w)
		}
	}
	return e.cfg, e.log, e.err
}

// errHelp is returned after help was printed on request: exit status 0.
var errHelp = flag.ErrHelp

// usageError is a command line the program does not understand: exit
// status 2. The message was already printed to stderr.
type usageError struct{ msg string }

func (u usageError) Error() string { return u.msg }

// exitCode maps run's error to the process's exit status.
func exitCode(err error) int {
	var u usageError
	switch {
	case err == nil, errors.Is(err, errHelp):
		return 0
	case errors.As(err, &u):
		return 2
	}
	return 1
}

func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help" || arg == "help"
}

// dispatch runs c with args; path is the command line up to c ("joblib
// tasks").
func dispatch(ctx context.Context, c *command, path string, args []string, e *cmdEnv) error {
	if len(c.subs) > 0 {
		name := c.dflt
		if len(args) > 0 {
			switch {
			case isHelp(args[0]):
				c.printUsage(e.stdout, path, nil)
				return errHelp
			case strings.HasPrefix(args[0], "-") && c.dflt == "":
				return e.usageErr(path, "unknown flag %s", args[0])
			case !strings.HasPrefix(args[0], "-"):
				name, args = args[0], args[1:]
			}
		}
		if name == "" {
			return e.usageErr(path, "missing command")
		}
		for _, s := range c.subs {
			if s.name == name {
				return dispatch(ctx, s, path+" "+name, args, e)
			}
		}
		return e.usageErr(path, "unknown command %q", name)
	}
	fs := flag.NewFlagSet(path, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	run := c.setup(fs)
	if c.raw {
		return run(ctx, e, args)
	}
	var pos []string
	rest := args
	for {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				c.printUsage(e.stdout, path, fs)
				return errHelp
			}
			return e.usageErr(path, "%s", flagError(err, rest))
		}
		rest = fs.Args()
		if len(rest) == 0 {
			break
		}
		pos = append(pos, rest[0])
		rest = rest[1:]
	}
	if len(pos) != c.nargs && !(c.optional && len(pos) < c.nargs) {
		if c.nargs == 0 {
			return e.usageErr(path, "unexpected argument %q", pos[0])
		}
		return e.usageErr(path, "want %d argument(s) (%s), got %d", c.nargs, c.args, len(pos))
	}
	return run(ctx, e, pos)
}

// flagError words a flag package error for a person: an unknown flag is
// named as it was typed (--port, not -port).
func flagError(err error, args []string) string {
	msg := err.Error()
	name, ok := strings.CutPrefix(msg, "flag provided but not defined: -")
	if !ok {
		return msg
	}
	for _, a := range args {
		if n, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "="); n == name && strings.HasPrefix(a, "-") {
			typed, _, _ := strings.Cut(a, "=")
			return "unknown flag " + typed
		}
	}
	return "unknown flag -" + name
}

// usageErr prints msg and a pointer to the help to stderr.
func (e *cmdEnv) usageErr(path, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	fmt.Fprintf(e.stderr, "%s: %s\nRun '%s --help' for usage.\n", path, msg, path)
	return usageError{path + ": " + msg}
}

func (c *command) printUsage(w io.Writer, path string, fs *flag.FlagSet) {
	if len(c.subs) > 0 {
		fmt.Fprintf(w, "Usage: %s <command> [flags]\n\n", path)
		if c.summary != "" && path != "joblib" {
			fmt.Fprintf(w, "%s\n\n", c.summary)
		}
		fmt.Fprintln(w, "Commands:")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, s := range c.subs {
			name := s.name
			if s.name == c.dflt {
				name += " (default)"
			}
			fmt.Fprintf(tw, "  %s\t%s\n", name, s.summary)
		}
		_ = tw.Flush()
		if c.long != "" {
			fmt.Fprintf(w, "\n%s", c.long)
		}
		fmt.Fprintf(w, "\nRun '%s <command> --help' for a command's flags.\n", path)
		return
	}
	syn := path
	hasFlags := false
	fs.VisitAll(func(*flag.Flag) { hasFlags = true })
	if hasFlags {
		syn += " [flags]"
	}
	if c.args != "" {
		syn += " " + c.args
	}
	fmt.Fprintf(w, "Usage: %s\n\n%s\n", syn, c.summary)
	if hasFlags {
		fmt.Fprintln(w, "\nFlags:")
		fs.SetOutput(w)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	if c.long != "" {
		fmt.Fprintf(w, "\n%s", c.long)
	}
}
