package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
)

func serveCommand() *command {
	return &command{
		name:    "serve",
		summary: "run the coordinator: REST, Socket.IO and metrics on one port",
		long: "On start, serve validates the configuration, binds the listener, then creates or\n" +
			"migrates the database. On an empty database without JOBLIB_ADMIN_TOKEN it creates a\n" +
			"superuser \"admin\" and prints its API token once, when the server is serving;\n" +
			"`joblib token create --user NAME --superuser` makes another at any time.\n",
		setup: func(fs *flag.FlagSet) runFunc {
			listen := fs.String("listen", "", "listen address `ADDR` (host:port); overrides JOBLIB_LISTEN_ADDR")
			return func(ctx context.Context, e *cmdEnv, _ []string) error {
				cfg, log, err := e.config()
				if err != nil {
					return err
				}
				if *listen != "" {
					if err := validateListenAddr(*listen); err != nil {
						return fmt.Errorf("--listen: %w", err)
					}
					cfg.Server.ListenAddr = *listen
				}
				return serve(ctx, cfg, log, e.stdout)
			}
		},
	}
}

func migrateCommand() *command {
	return &command{
		name:    "migrate",
		summary: "create the database or bring its schema up to date, then exit",
		setup: func(fs *flag.FlagSet) runFunc {
			return func(ctx context.Context, e *cmdEnv, _ []string) error {
				cfg, log, err := e.config()
				if err != nil {
					return err
				}
				db, err := openDB(ctx, cfg, log, true)
				if err != nil {
					return err
				}
				defer db.Close()
				v, err := db.SchemaVersion(ctx)
				if err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "%s: schema at version %d\n", models.Describe(cfg.DatabaseURL), v)
				return nil
			}
		},
	}
}

// serve runs the coordinator until ctx is cancelled (SIGTERM/SIGINT), then
// drains in-flight requests within ShutdownTimeout. The order matters to an
// operator: the configuration was validated before; the listener is bound
// before the database is created or migrated (a busy port changes
// nothing); a fresh database's admin token is printed only once serving.
func serve(ctx context.Context, cfg Config, log *slog.Logger, stdout io.Writer) error {
	ln, err := net.Listen("tcp", cfg.Server.ListenAddr)
	if err != nil {
		return fmt.Errorf("listen on %s (JOBLIB_LISTEN_ADDR or --listen): %w", cfg.Server.ListenAddr, err)
	}
	defer ln.Close()
	db, err := openDB(ctx, cfg, log, true)
	if err != nil {
		return err
	}
	defer db.Close()

	node, err := joblib.NewNode(cfg.Settings.NodeID)
	if err != nil {
		return err
	}
	var bus events.Bus = events.NewLocalBus()
	switch {
	case cfg.BusURL != "":
		// NATS: events leave after commit on a subject the nodes share.
		nb := events.NewNATSBus(cfg.BusURL, cfg.BusSubject, node.ID+"/"+node.Run, log.With("component", "events"))
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := nb.Start(sctx)
		cancel()
		if err != nil {
			return err
		}
		defer nb.Stop()
		bus = nb
	case db.Pool != nil:
		// PostgreSQL: several nodes may share the database; events reach
		// the sockets and long-polls of every node.
		pb := events.NewPGBus(db.Pool, node.ID+"/"+node.Run, log.With("component", "events"))
		if err := pb.Start(ctx); err != nil {
			return err
		}
		defer pb.Stop()
		bus = pb
	}
	svc := joblib.New(joblib.Config{DB: db, Bus: bus, Logger: log.With("component", "joblib"), Settings: cfg.Settings, Node: node})
	defer svc.Close()

	// Internal jobs run inside this process; their job rows are ensured
	// before the first request so submissions find them. The built-in ones
	// are opt-in: rooms list exactly the jobs clients registered.
	if cfg.BuiltinJobs {
		if err := svc.RegisterInternal(joblib.RoomSummaryJob(svc)); err != nil {
			return err
		}
	}
	if err := svc.EnsureInternalJobs(ctx); err != nil {
		return err
	}
	if err := svc.RetireBuiltinJobs(ctx); err != nil {
		return err
	}
	// Result cache upkeep (and, on PostgreSQL, the cross-node LISTEN) and the
	// internal executor; svc.Close stops them after the HTTP drain.
	if err := svc.Start(ctx); err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := server.NewMetrics(reg, svc)
	if err != nil {
		return err
	}
	stopRecovery, err := recoverNode(ctx, db, svc, cfg.Realtime.DisconnectGrace, log)
	if err != nil {
		return err
	}
	defer stopRecovery()
	sweeper := joblib.NewSweeper(svc, joblib.SweeperConfig{Logger: log, NodeGrace: cfg.Realtime.DisconnectGrace})
	metrics.ObserveSweeper(sweeper)
	if err := sweeper.Start(ctx); err != nil {
		return fmt.Errorf("start sweeper: %w", err)
	}
	defer sweeper.Stop()

	srv := server.New(svc, cfg.Server, log.With("component", "http"))
	rt := srv.NewRealtime(cfg.Realtime, log.With("component", "socketio"))
	rt.ObserveSweeper(sweeper)
	srv.Handle("/socket.io/", rt)
	rt.Start()
	reg.MustRegister(server.SocketCollector(rt), server.ForwardCollector(rt), srv.Rejections())
	metricsHandler := server.RequireBearer(cfg.Server.MetricsToken, server.MetricsHandler(reg))
	if cfg.Server.MetricsAddr == "" {
		srv.Handle("GET /metrics", metricsHandler)
	} else {
		// A listener of its own (an internal interface, say); the public
		// one answers 404 for /metrics.
		mln, err := net.Listen("tcp", cfg.Server.MetricsAddr)
		if err != nil {
			return fmt.Errorf("listen for metrics on %s: %w", cfg.Server.MetricsAddr, err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", metricsHandler)
		ms := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, WriteTimeout: time.Minute,
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
		go func() { _ = ms.Serve(mln) }()
		defer ms.Close()
		log.Info("metrics listening", "addr", mln.Addr().String())
	}
	// Last before serving: a token created earlier would be lost with a
	// failed start (a fresh database's token is shown only once).
	token, err := bootstrapAuth(ctx, cfg, svc)
	if err != nil {
		return err
	}
	if token == "" {
		if ok, err := svc.HasSuperuser(ctx); err != nil {
			return err
		} else if !ok {
			log.Warn("no superuser exists: nobody can log in to the dashboard (/ui/) or act as an operator; " +
				"make one with `joblib token create --user NAME --superuser`, or set JOBLIB_ADMIN_TOKEN")
		}
	}
	// The lease says this run is alive (and where other nodes reach it);
	// stopping it at shutdown makes this node's sockets count as closed
	// at once, so that their workers get their grace from that moment.
	lease := svc.NewLease(joblib.LeaseConfig{
		Addr:   advertiseAddr(cfg.NodeAddr, ln.Addr()),
		Logger: log,
		OnLost: func() { rt.LeaseLost() },
	})
	if err := lease.Start(ctx); err != nil {
		ln.Close()
		return fmt.Errorf("start node lease: %w", err)
	}
	defer lease.Stop()
	longest := max(cfg.Settings.LongPollMaxWait, cfg.Settings.ProviderLongPollMax)
	hs := &http.Server{
		Handler:           srv.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       2 * time.Minute,
		WriteTimeout:      longest + time.Minute,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	hs.RegisterOnShutdown(svc.Drain)
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	if token != "" {
		fmt.Fprintf(stdout, "No users yet: created superuser \"admin\" with this API token (shown once;\n"+
			"`joblib token create --user NAME --superuser` makes another):\n%s\n", token)
		log.Info("created the initial admin token; it was printed to stdout")
	}
	log.Info("listening", "addr", ln.Addr().String(), "database", db.Dialect(), "url", models.Describe(cfg.DatabaseURL))

	select {
	case err := <-errc:
		return fmt.Errorf("serve http: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down", "timeout", cfg.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
	defer cancel()
	if err := rt.Shutdown(sctx); err != nil {
		log.Warn("close sockets", "err", err)
	}
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("drain http: %w", err)
	}
	log.Info("stopped")
	return nil
}

// bootstrapAuth makes sure somebody can log in: the configured admin token,
// or, on an empty database without one, a freshly issued admin token that
// the caller prints once serving.
func bootstrapAuth(ctx context.Context, cfg Config, svc *joblib.Service) (string, error) {
	if cfg.Server.AdminToken != "" {
		return "", svc.EnsureAdminToken(ctx, cfg.Server.AdminToken)
	}
	tok, err := svc.CreateFirstAdmin(ctx)
	if err != nil {
		return "", err
	}
	return tok, nil
}

// nodeLockPatience is how long a starting process waits for its node id's
// lock before refusing to start.
const nodeLockPatience = 3 * time.Second

// recoverNode takes the node lock and runs startup recovery: it cleans the
// workers whose sockets an earlier run of this node held. It waits one
// disconnect grace window first, so that workers whose sockets reconnect to
// this run (a restart or a deploy is a socket blip to them) re-attach and
// keep their claims, exactly as after a dropped connection. The node lock
// (held for the process's life) guarantees that no other running process
// uses the same node id: when another live process holds it, this one
// refuses to start (an error, so a non-zero exit). Recovery is also fenced
// by run: it never touches a run whose lease is live. The returned function
// stops a pending recovery and releases the lock.
func recoverNode(ctx context.Context, db *models.DB, svc *joblib.Service, grace time.Duration, log *slog.Logger) (stop func(), err error) {
	node := svc.Node()
	lock := db.NewSessionLock("node:" + node.ID)
	// A process restarted right after its predecessor was killed can find
	// the dead process's database session not yet ended (the server notices
	// the closed connection a moment later): try for a few seconds before
	// calling the id taken.
	var held bool
	for deadline := time.Now().Add(nodeLockPatience); ; {
		if held, err = lock.Hold(ctx); err != nil {
			return nil, fmt.Errorf("lock node id %q: %w", node.ID, err)
		}
		if held || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	if !held {
		return nil, fmt.Errorf("node id %q is held by another running process: give each process its own JOBLIB_NODE_ID (or leave it unset for a unique one)", node.ID)
	}
	log.Info("node started", "node", node.ID, "run", node.Run, "recovery_in", grace)
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-rctx.Done():
			return
		case <-time.After(grace):
		}
		res, err := svc.RecoverNode(rctx)
		if err != nil {
			if rctx.Err() == nil {
				log.Error("startup recovery", "node", node.ID, "err", err)
			}
			return
		}
		log.Info("startup recovery done", "node", node.ID, "run", node.Run, "recovered_workers", res.Cleaned,
			"tasks_failed", res.TasksFailed, "tasks_requeued", res.TasksRequeued)
	}()
	return func() {
		cancel()
		<-done
		lock.Release()
	}, nil
}

// advertiseAddr is the address other nodes reach this one at: the
// configured JOBLIB_NODE_ADDR, else the listen address, with an unspecified
// host (":8080", "0.0.0.0:8080") replaced by this host's name.
func advertiseAddr(configured string, ln net.Addr) string {
	if configured != "" {
		return configured
	}
	host, port, err := net.SplitHostPort(ln.String())
	if err != nil {
		return ln.String()
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		if h, err := os.Hostname(); err == nil {
			host = h
		}
	}
	return net.JoinHostPort(host, port)
}
