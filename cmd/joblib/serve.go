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
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/startstop"
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
// drains in-flight requests within ShutdownTimeout and stops its parts in
// the reverse of their start order (serveParts). A part that fails to start
// stops the ones started before it, and the error names it.
func serve(ctx context.Context, cfg Config, log *slog.Logger, stdout io.Writer) error {
	p := &process{cfg: cfg, log: log, stdout: stdout, served: make(chan error, 1)}
	parts := startstop.NewSequence(p.serveParts()...)
	if err := parts.Start(ctx); err != nil {
		return err
	}
	defer parts.Stop()
	select {
	case err := <-p.served:
		return fmt.Errorf("serve http: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down", "timeout", cfg.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
	defer cancel()
	p.shutdown = sctx
	parts.Stop()
	if p.drainErr != nil {
		return fmt.Errorf("drain http: %w", p.drainErr)
	}
	log.Info("stopped")
	return nil
}

// process is what serve's parts build, each from those started before it.
type process struct {
	cfg    Config
	log    *slog.Logger
	stdout io.Writer

	ln      net.Listener
	db      *models.DB
	node    joblib.Node
	bus     events.Bus
	svc     *joblib.Service
	reg     *prometheus.Registry
	metrics *server.Metrics
	sweeper *joblib.Sweeper
	srv     *server.Server
	rt      *server.Realtime
	recov   *nodeRecovery
	ms      *http.Server // the metrics listener's, when JOBLIB_METRICS_ADDR is set
	lease   *joblib.Lease
	token   string // a fresh database's admin token, printed once serving
	hs      *http.Server

	served   chan error      // hs.Serve's end
	shutdown context.Context // the shutdown budget (nil: stopping after a failure)
	drainErr error
}

// serveParts are serve's parts in start order. The order matters to an
// operator: the configuration was validated before; the listener is bound
// before the database is created or migrated (a busy port changes
// nothing); a fresh database's admin token is created last before the
// lease and serving (a token created earlier would be lost with a failed
// start, and it is shown only once).
func (p *process) serveParts() []startstop.Part {
	return []startstop.Part{
		{Name: "listener", Start: p.listen, Stop: func() { p.ln.Close() }},
		{Name: "database", Start: p.openDB, Stop: func() { p.db.Close() }},
		{Name: "event bus", Start: p.startBus, Stop: p.stopBus},
		{Name: "service", Start: p.newService, Stop: func() { p.svc.Close() }},
		{Name: "internal jobs", Start: p.internalJobs},
		{Name: "service loops", Start: func(ctx context.Context) error { return p.svc.Start(ctx) }, Stop: func() { p.svc.Stop() }},
		{Name: "metrics", Start: p.newMetrics},
		{Name: "node recovery", Start: p.startRecovery, Stop: func() { p.recov.Stop() }},
		{Name: "sweeper", Start: p.startSweeper, Stop: func() { p.sweeper.Stop() }},
		{Name: "sockets", Start: p.startSockets, Stop: func() { p.rt.Stop() }},
		{Name: "metrics endpoint", Start: p.metricsEndpoint, Stop: p.closeMetrics},
		{Name: "admin", Start: p.bootstrapAdmin},
		{Name: "node lease", Start: p.startLease, Stop: func() { p.lease.Stop() }},
		{Name: "http", Start: p.startHTTP, Stop: p.drainHTTP},
	}
}

func (p *process) listen(context.Context) error {
	ln, err := net.Listen("tcp", p.cfg.Server.ListenAddr)
	if err != nil {
		return fmt.Errorf("listen on %s (JOBLIB_LISTEN_ADDR or --listen): %w", p.cfg.Server.ListenAddr, err)
	}
	p.ln = ln
	return nil
}

func (p *process) openDB(ctx context.Context) (err error) {
	p.db, err = openDB(ctx, p.cfg, p.log, true)
	return err
}

// busStopper is the bus's Stop, for the buses that run (not the local one).
type busStopper interface{ Stop() }

func (p *process) startBus(ctx context.Context) (err error) {
	if p.node, err = joblib.NewNode(p.cfg.Settings.NodeID); err != nil {
		return err
	}
	node := p.node
	p.bus = events.NewLocalBus()
	switch {
	case p.cfg.BusURL != "":
		// NATS: events leave after commit on a subject the nodes share.
		nb := events.NewNATSBus(p.cfg.BusURL, p.cfg.BusSubject, node.ID+"/"+node.Run, p.log.With("component", "events"))
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := nb.Start(sctx)
		cancel()
		if err != nil {
			return err
		}
		p.bus = nb
	case p.db.Caps().Listen:
		// PostgreSQL: several nodes may share the database; events reach
		// the sockets and long-polls of every node.
		pb := events.NewPGBus(p.db.Pool, node.ID+"/"+node.Run, p.log.With("component", "events"))
		if err := pb.Start(ctx); err != nil {
			return err
		}
		p.bus = pb
	}
	return nil
}

func (p *process) stopBus() {
	if b, ok := p.bus.(busStopper); ok {
		b.Stop()
	}
}

// newService builds the service; closing it detaches it from the bus.
func (p *process) newService(context.Context) error {
	p.svc = joblib.New(joblib.Config{DB: p.db, Bus: p.bus, Logger: p.log.With("component", "joblib"), Settings: p.cfg.Settings, Node: p.node})
	return nil
}

// internalJobs: internal jobs run inside this process; their job rows are
// ensured before the first request so submissions find them. The built-in
// ones are opt-in: rooms list exactly the jobs clients registered.
func (p *process) internalJobs(ctx context.Context) error {
	if p.cfg.BuiltinJobs {
		if err := p.svc.RegisterInternal(joblib.RoomSummaryJob(p.svc)); err != nil {
			return err
		}
	}
	if err := p.svc.EnsureInternalJobs(ctx); err != nil {
		return err
	}
	return p.svc.RetireBuiltinJobs(ctx)
}

func (p *process) newMetrics(context.Context) (err error) {
	p.reg = prometheus.NewRegistry()
	p.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	p.metrics, err = server.NewMetrics(p.reg, p.svc)
	return err
}

func (p *process) startRecovery(ctx context.Context) error {
	p.recov = newNodeRecovery(p.db, p.svc, p.cfg.Realtime.DisconnectGrace, p.log)
	return p.recov.Start(ctx)
}

func (p *process) startSweeper(ctx context.Context) error {
	p.sweeper = joblib.NewSweeper(p.svc, joblib.SweeperConfig{Logger: p.log, NodeGrace: p.cfg.Realtime.DisconnectGrace})
	p.metrics.ObserveSweeper(p.sweeper)
	return p.sweeper.Start(ctx)
}

func (p *process) startSockets(ctx context.Context) error {
	p.srv = server.New(p.svc, p.cfg.Server, p.log.With("component", "http"))
	p.rt = p.srv.NewRealtime(p.cfg.Realtime, p.log.With("component", "socketio"))
	p.rt.ObserveSweeper(p.sweeper)
	p.srv.Handle("/socket.io/", p.rt)
	if err := p.rt.Start(ctx); err != nil {
		return err
	}
	p.reg.MustRegister(server.SocketCollector(p.rt), server.ForwardCollector(p.rt), p.srv.Rejections())
	p.reg.MustRegister(server.HomeCollectors(p.srv)...)
	return nil
}

func (p *process) metricsEndpoint(context.Context) error {
	metricsHandler := server.RequireBearer(p.cfg.Server.MetricsToken, server.MetricsHandler(p.reg))
	if p.cfg.Server.MetricsAddr == "" {
		p.srv.Handle("GET /metrics", metricsHandler)
		return nil
	}
	// A listener of its own (an internal interface, say); the public
	// one answers 404 for /metrics.
	mln, err := net.Listen("tcp", p.cfg.Server.MetricsAddr)
	if err != nil {
		return fmt.Errorf("listen for metrics on %s: %w", p.cfg.Server.MetricsAddr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metricsHandler)
	p.ms = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, WriteTimeout: time.Minute,
		ErrorLog: slog.NewLogLogger(p.log.Handler(), slog.LevelWarn)}
	go func() { _ = p.ms.Serve(mln) }()
	p.log.Info("metrics listening", "addr", mln.Addr().String())
	return nil
}

func (p *process) closeMetrics() {
	if p.ms != nil {
		p.ms.Close()
	}
}

// bootstrapAdmin creates a fresh database's admin token (printed once
// serving) or warns that nobody can log in.
func (p *process) bootstrapAdmin(ctx context.Context) (err error) {
	if p.token, err = bootstrapAuth(ctx, p.cfg, p.svc); err != nil || p.token != "" {
		return err
	}
	if ok, err := p.svc.HasSuperuser(ctx); err != nil {
		return err
	} else if !ok {
		p.log.Warn("no superuser exists: nobody can log in to the dashboard (/ui/) or act as an operator; " +
			"make one with `joblib token create --user NAME --superuser`, or set JOBLIB_ADMIN_TOKEN")
	}
	return nil
}

// startLease: the lease says this run is alive (and where other nodes
// reach it); stopping it at shutdown makes this node's sockets count as
// closed at once, so that their workers get their grace from that moment.
func (p *process) startLease(ctx context.Context) error {
	p.lease = p.svc.NewLease(joblib.LeaseConfig{
		Addr:   advertiseAddr(p.cfg.NodeAddr, p.ln.Addr()),
		Logger: p.log,
		OnLost: func() { p.rt.LeaseLost() },
	})
	return p.lease.Start(ctx)
}

func (p *process) startHTTP(context.Context) error {
	longest := max(p.cfg.Settings.LongPollMaxWait, p.cfg.Settings.ProviderLongPollMax)
	p.hs = &http.Server{
		Handler:           p.srv.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       2 * time.Minute,
		WriteTimeout:      longest + time.Minute,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelWarn),
	}
	p.hs.RegisterOnShutdown(p.svc.Drain)
	go func() { p.served <- p.hs.Serve(p.ln) }()
	if p.token != "" {
		fmt.Fprintf(p.stdout, "No users yet: created superuser \"admin\" with this API token (shown once;\n"+
			"`joblib token create --user NAME --superuser` makes another):\n%s\n", p.token)
		p.log.Info("created the initial admin token; it was printed to stdout")
	}
	p.log.Info("listening", "addr", p.ln.Addr().String(), "database", p.db.Dialect(), "url", models.Describe(p.cfg.DatabaseURL))
	return nil
}

// drainHTTP closes the sockets first (a polling socket's request is held
// open for up to a ping interval, and the HTTP drain would wait for it),
// then drains the HTTP requests; long-polls answer at once (svc.Drain).
func (p *process) drainHTTP() {
	ctx := p.shutdown
	if ctx == nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.Background(), p.cfg.ShutdownTimeout)
		defer cancel()
	}
	if err := p.rt.Shutdown(ctx); err != nil {
		p.log.Warn("close sockets", "err", err)
	}
	if err := p.hs.Shutdown(ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		p.drainErr = err
	}
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

// nodeRecovery holds the node lock and runs startup recovery: it cleans the
// workers whose sockets an earlier run of this node held. It waits one
// disconnect grace window first, so that workers whose sockets reconnect to
// this run (a restart or a deploy is a socket blip to them) re-attach and
// keep their claims, exactly as after a dropped connection. The node lock
// (held for the process's life) guarantees that no other running process
// uses the same node id: when another live process holds it, Start fails
// (so a non-zero exit). Recovery is also fenced by run: it never touches a
// run whose lease is live. Stop ends a pending recovery and releases the
// lock.
type nodeRecovery struct {
	startstop.Base
	db    *models.DB
	svc   *joblib.Service
	grace time.Duration
	log   *slog.Logger

	mu   sync.Mutex
	lock *models.SessionLock // held while started
}

func newNodeRecovery(db *models.DB, svc *joblib.Service, grace time.Duration, log *slog.Logger) *nodeRecovery {
	return &nodeRecovery{db: db, svc: svc, grace: grace, log: log}
}

// Start takes the node lock and schedules the recovery.
func (r *nodeRecovery) Start(ctx context.Context) error {
	node := r.svc.Node()
	lock := r.db.NewSessionLock("node:" + node.ID)
	// A process restarted right after its predecessor was killed can find
	// the dead process's database session not yet ended (the server notices
	// the closed connection a moment later): try for a few seconds before
	// calling the id taken.
	var held bool
	var err error
	for deadline := time.Now().Add(nodeLockPatience); ; {
		if held, err = lock.Hold(ctx); err != nil {
			return fmt.Errorf("lock node id %q: %w", node.ID, err)
		}
		if held || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	if !held {
		return fmt.Errorf("node id %q is held by another running process: give each process its own JOBLIB_NODE_ID (or leave it unset for a unique one)", node.ID)
	}
	rctx, ok := r.StartInit(ctx)
	if !ok {
		lock.Release()
		return nil
	}
	r.mu.Lock()
	r.lock = lock
	r.mu.Unlock()
	r.log.Info("node started", "node", node.ID, "run", node.Run, "recovery_in", r.grace)
	r.Go(func() { r.recover(rctx) })
	return nil
}

func (r *nodeRecovery) recover(ctx context.Context) {
	node := r.svc.Node()
	select {
	case <-ctx.Done():
		return
	case <-time.After(r.grace):
	}
	res, err := r.svc.RecoverNode(ctx)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Error("startup recovery", "node", node.ID, "err", err)
		}
		return
	}
	r.log.Info("startup recovery done", "node", node.ID, "run", node.Run, "recovered_workers", res.Cleaned,
		"tasks_failed", res.TasksFailed, "tasks_requeued", res.TasksRequeued)
}

// Stop ends a pending recovery and releases the node lock.
func (r *nodeRecovery) Stop() {
	r.Base.Stop()
	r.mu.Lock()
	lock := r.lock
	r.lock = nil
	r.mu.Unlock()
	if lock != nil {
		lock.Release()
	}
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
