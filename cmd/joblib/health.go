package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"time"
)

// healthCommand probes a running server's /readyz: the container
// HEALTHCHECK (the image has no shell, curl or wget). It reads only
// JOBLIB_LISTEN_ADDR, never the database.
func healthCommand() *command {
	return &command{
		name:    "health",
		summary: "probe a running server's /readyz (exit 0 ready, 1 not); for container health checks",
		setup: func(fs *flag.FlagSet) runFunc {
			url := fs.String("url", "", "`URL` to probe (default http://127.0.0.1:PORT/readyz, PORT from JOBLIB_LISTEN_ADDR)")
			timeout := fs.Duration("timeout", 3*time.Second, "give up after this long")
			return func(ctx context.Context, e *cmdEnv, _ []string) error {
				target := *url
				if target == "" {
					addr := cmp.Or(e.environ["JOBLIB_LISTEN_ADDR"], ":8080")
					_, port, err := net.SplitHostPort(addr)
					if err != nil {
						return fmt.Errorf("JOBLIB_LISTEN_ADDR: listen address %q must be host:port", addr)
					}
					target = "http://" + net.JoinHostPort("127.0.0.1", port) + "/readyz"
				}
				ctx, cancel := context.WithTimeout(ctx, *timeout)
				defer cancel()
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
				if err != nil {
					return e.usageErr("joblib health", "--url: %v", err)
				}
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					return fmt.Errorf("health %s: %w", target, err)
				}
				res.Body.Close()
				if res.StatusCode != http.StatusOK {
					return fmt.Errorf("health %s: %s", target, res.Status)
				}
				fmt.Fprintf(e.stdout, "ready: %s\n", target)
				return nil
			}
		},
	}
}
