package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/server"
)

// serve runs the coordinator until ctx is cancelled (SIGTERM/SIGINT), then
// drains in-flight requests within ShutdownTimeout.
func serve(ctx context.Context, cfg Config, log *slog.Logger, stdout io.Writer) error {
	db, err := openDB(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer db.Close()

	node := joblib.Node{ID: nodeID(), Run: uuid.NewString()}
	var bus events.Bus = events.NewLocalBus()
	if db.Pool != nil {
		// PostgreSQL: several nodes may share the database; events reach
		// the sockets and long-polls of every node.
		pb := events.NewPGBus(db.Pool, node.ID+"/"+node.Run, log.With("component", "events"))
		if err := pb.Start(ctx); err != nil {
			return err
		}
		defer pb.Stop()
		bus = pb
	}
	svc := joblib.New(joblib.Config{DB: db, Bus: bus, Logger: log.With("component", "joblib"), Settings: cfg.Settings})
	defer svc.Close()

	if err := bootstrapAuth(ctx, cfg, svc, log, stdout); err != nil {
		return err
	}
	// Internal jobs run inside this process; their job rows are ensured
	// before the first request so submissions find them.
	if err := svc.RegisterInternal(joblib.RoomSummaryJob(svc)); err != nil {
		return err
	}
	if err := svc.EnsureInternalJobs(ctx); err != nil {
		return err
	}
	// Result cache upkeep (and, on PostgreSQL, the cross-node LISTEN) and the
	// internal executor; svc.Close stops them after the HTTP drain.
	if err := svc.Start(ctx); err != nil {
		return err
	}

	srv := server.New(svc, cfg.Server, log.With("component", "http"))
	rt := srv.NewRealtime(cfg.Realtime, node, log.With("component", "socketio"))
	srv.Handle("/socket.io/", rt)
	rt.Start()
	ln, err := net.Listen("tcp", cfg.Server.ListenAddr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Server.ListenAddr, err)
	}
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
	log.Info("listening", "addr", ln.Addr().String(), "database", db.Dialect())

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

// nodeID names this node for socket bindings: stable across restarts.
func nodeID() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "joblib"
	}
	return h
}

// bootstrapAuth makes sure somebody can log in: the configured admin token,
// or, on an empty database without one, a freshly issued admin token printed
// once.
func bootstrapAuth(ctx context.Context, cfg Config, svc *joblib.Service, log *slog.Logger, stdout io.Writer) error {
	if cfg.Server.AdminToken != "" {
		return svc.EnsureAdminToken(ctx, cfg.Server.AdminToken)
	}
	has, err := svc.HasUsers(ctx)
	if err != nil || has {
		return err
	}
	tok, _, err := svc.CreateToken(ctx, "admin", true)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "No users yet: created superuser \"admin\" with this API token (shown once):\n%s\n", tok)
	log.Info("created initial admin token; it was printed to stdout")
	return nil
}
