package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// healthCommand probes a running server's /readyz: the container
// HEALTHCHECK (the image has no shell, curl or wget). It reads only
// JOBLIB_LISTEN_ADDR, never the database.
func healthCommand() *command {
	c := &command{
		name:    "health",
		summary: "probe a running server's /readyz (exit 0 ready, 1 not); for container health checks",
		setup: func(fs *flag.FlagSet) runFunc {
			target := fs.String("url", "", "the server's base `URL`, e.g. http://host:8080 (/readyz is added; default http://127.0.0.1:PORT, PORT from JOBLIB_LISTEN_ADDR)")
			timeout := 3 * time.Second
			fs.Var(durationFlag{&timeout}, "timeout", "give up after this long, e.g. 3s")
			return func(ctx context.Context, e *cmdEnv, args []string) error {
				base := *target
				if len(args) > 0 {
					base = args[0]
				}
				if base == "" {
					addr := cmp.Or(e.environ["JOBLIB_LISTEN_ADDR"], ":8080")
					_, port, err := net.SplitHostPort(addr)
					if err != nil {
						return fmt.Errorf("JOBLIB_LISTEN_ADDR: listen address %q must be host:port", addr)
					}
					base = "http://" + net.JoinHostPort("127.0.0.1", port)
				}
				probe, err := readyzURL(base)
				if err != nil {
					return e.usageErr("joblib health", "%v", err)
				}
				ctx, cancel := context.WithTimeout(ctx, timeout)
				defer cancel()
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, probe, nil)
				if err != nil {
					return e.usageErr("joblib health", "--url: %v", err)
				}
				res, err := http.DefaultClient.Do(req)
				switch {
				case errors.Is(err, syscall.ECONNREFUSED):
					return fmt.Errorf("no server listens at %s (connection refused): is `joblib serve` running there?", base)
				case errors.Is(err, context.DeadlineExceeded):
					return fmt.Errorf("no answer from %s within %s", base, timeout)
				case err != nil:
					var dns *net.DNSError
					if errors.As(err, &dns) {
						return fmt.Errorf("cannot reach %s: unknown host %q", base, dns.Name)
					}
					return fmt.Errorf("cannot reach %s: %v", base, errors.Unwrap(err))
				}
				res.Body.Close()
				if res.StatusCode != http.StatusOK {
					return fmt.Errorf("not ready: %s answered %s", probe, res.Status)
				}
				fmt.Fprintf(e.stdout, "ready: %s\n", probe)
				return nil
			}
		},
	}
	c.args, c.nargs, c.optional = "[URL]", 1, true
	return c
}

// readyzURL is the readiness probe of a server's base URL; a URL that
// already names a path is probed as given.
func readyzURL(base string) (string, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("%q is not a server URL such as http://host:8080", base)
	}
	if strings.Trim(u.Path, "/") == "" {
		u.Path = "/readyz"
	}
	return u.String(), nil
}
