package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"runtime"
	"runtime/debug"
)

// version and commit may be set at link time (-ldflags "-X main.version=v1.2.3
// -X main.commit=abc123"), for builds without VCS stamping (a Docker build
// context without .git); otherwise they come from the build information.
var version, commit = "", ""

// buildInfo describes the running binary: its version, the commit it was
// built from (with "+dirty" when the work tree had changes, and its time)
// and the Go release that built it.
func buildInfo() (ver, rev, goVersion string) {
	ver, rev = version, commit
	if bi, ok := debug.ReadBuildInfo(); ok {
		if ver == "" {
			ver = bi.Main.Version
		}
		var vcsRev, modified, at string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				vcsRev = s.Value
			case "vcs.modified":
				modified = s.Value
			case "vcs.time":
				at = s.Value
			}
		}
		if rev == "" && vcsRev != "" {
			rev = vcsRev[:min(12, len(vcsRev))]
			if modified == "true" {
				rev += "+dirty"
			}
			if at != "" {
				rev += " " + at
			}
		}
	}
	return cmp.Or(ver, "(devel)"), cmp.Or(rev, "unknown"), runtime.Version()
}

func versionCommand() *command {
	return &command{
		name:    "version",
		summary: "print the version, the commit it was built from and the Go release (also: joblib --version)",
		setup: func(fs *flag.FlagSet) runFunc {
			return func(_ context.Context, e *cmdEnv, _ []string) error {
				v, c, g := buildInfo()
				fmt.Fprintf(e.stdout, "joblib %s (commit %s, %s)\n", v, c, g)
				return nil
			}
		},
	}
}
