package joblib

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/startstop"
	"github.com/zndraw/joblib/models"
)

// Service is the coordinator's domain API. The REST handlers, the Socket.IO
// handlers, the sweeper and the CLI all go through it. It is safe for
// concurrent use.
type Service struct {
	db       *models.DB
	bus      events.Bus
	log      *slog.Logger
	watch    taskWatch
	unsubbus func()
	draining chan struct{}
	drainOne sync.Once

	mu        sync.RWMutex
	settings  Settings
	internal  map[string]InternalJob
	observers []CleanupObserver
	runner    *internalRunner
	relay     *relay
	cache     ResultCache
	rates     rateLimits
	progress  *progressCoalescer
	reports   *reportBatcher
	claims    *claimBatcher

	node        Node
	lease       atomic.Pointer[Lease] // this node's lease, once NewLease made it
	fpObservers []func(FalsePositive)
	pruneObs    []func(status string, n int64)

	// touched: token id -> when this process last recorded its use.
	touched sync.Map

	trends *Trends // the dashboard's last hour; claims are recorded here

	sched *scheduler // kicks the leader's timer of delayed tasks
}

// Config is what a Service is built from.
type Config struct {
	DB       *models.DB
	Bus      events.Bus   // default: a new in-process LocalBus
	Logger   *slog.Logger // default: discard
	Settings Settings     // zero value: DefaultSettings()
	// ResultCache holds provider results. Default: the PostgreSQL cache on a
	// PostgreSQL database (readers on every node are woken), else in memory.
	ResultCache ResultCache
	// Node is this process's identity; zero: NewNode(Settings.NodeID).
	Node Node
}

// New builds a Service. Call Close when done.
func New(cfg Config) *Service {
	if cfg.Bus == nil {
		cfg.Bus = events.NewLocalBus()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Settings.WorkerTimeout == 0 {
		cfg.Settings = DefaultSettings()
	}
	def := DefaultSettings()
	cfg.Settings.ProviderMaxResultBytes = cmp.Or(cfg.Settings.ProviderMaxResultBytes, def.ProviderMaxResultBytes)
	cfg.Settings.InternalWorkers = cmp.Or(cfg.Settings.InternalWorkers, def.InternalWorkers)
	cfg.Settings.TaskRetentionBatch = cmp.Or(cfg.Settings.TaskRetentionBatch, def.TaskRetentionBatch)
	cfg.Settings.NodeLeaseTimeout = cmp.Or(cfg.Settings.NodeLeaseTimeout, def.NodeLeaseTimeout)
	cfg.Settings.MaxSubmitBatch = cmp.Or(cfg.Settings.MaxSubmitBatch, def.MaxSubmitBatch)
	cfg.Settings.IdempotencyWindow = cmp.Or(cfg.Settings.IdempotencyWindow, def.IdempotencyWindow)
	cfg.Settings.TaskProgressRate = cmp.Or(cfg.Settings.TaskProgressRate, def.TaskProgressRate)
	if cfg.ResultCache == nil {
		cfg.ResultCache = DefaultResultCache(cfg.DB, cfg.Logger, cfg.Settings.ResultCacheBudget())
	}
	s := &Service{
		db:       cfg.DB,
		bus:      cfg.Bus,
		log:      cfg.Logger,
		settings: cfg.Settings,
		watch:    newTaskWatch(),
		trends:   NewTrends(nil),
		draining: make(chan struct{}),
		internal: map[string]InternalJob{},
		cache:    cfg.ResultCache,
		rates:    newRateLimits(cfg.Settings),
	}
	s.progress = newProgressCoalescer(s.publishNow, func() float64 { return s.Settings().TaskProgressRate })
	s.runner = newInternalRunner(s)
	s.relay = newRelay(s)
	groupDelay := func() time.Duration { return s.Settings().GroupCommitDelay }
	s.claims = newClaimBatcher(s.db, s.hotNotify, groupDelay)
	s.reports = newReportBatcher(func(ctx context.Context, ups []models.HotUpdate) ([]models.HotTask, error) {
		return s.db.UpdateTasksHot(ctx, ups, hotTransitions, s.hotNotify())
	}, groupDelay)
	s.node = cfg.Node
	if s.node.ID == "" {
		n, err := NewNode(cfg.Settings.NodeID)
		if err != nil {
			n = Node{ID: "node", Run: uuid.NewString()}
		}
		s.node = n
	}
	s.sched = newScheduler()
	s.unsubbus = s.bus.Subscribe(func(e events.Emission) {
		s.watch.observe(e)
		s.sched.observe(e)
	})
	if m, ok := s.bus.(events.Monitored); ok {
		// Changes of other nodes may have been missed: every task
		// long-poll re-reads its row.
		m.Monitor().OnGap(func(events.Gap) { s.watch.WakeAll() })
	}
	return s
}

// Start runs the service's background parts: the result cache's upkeep
// (expiry, cross-node listener) and the @internal task executor. Stop ends
// them; both follow the start/stop contract (Stop is idempotent and blocks).
func (s *Service) Start(ctx context.Context) error {
	if err := s.cache.Start(ctx); err != nil {
		return err
	}
	if err := s.runner.Start(ctx); err != nil {
		s.cache.Stop()
		return err
	}
	s.relay.start()
	return nil
}

// Stop ends what Start started, the executor first (its last writes still
// need the database), then the outbox relay (after a last pass), then the
// cache.
func (s *Service) Stop() {
	s.runner.Stop()
	s.relay.stop()
	s.cache.Stop()
}

// Service follows the one start/stop contract. Drain is a step of its own,
// before Stop: the HTTP drain runs it so that long-polls answer at once.
var _ startstop.Service = (*Service)(nil)

// Close stops the service and detaches it from its bus.
func (s *Service) Close() {
	s.Stop()
	s.unsubbus()
}

// Drain ends every long-poll at once with the current state, so a shutting
// down server does not wait out their timeouts; clients simply poll again.
func (s *Service) Drain() { s.drainOne.Do(func() { close(s.draining) }) }

// ResultCache is where provider results are kept.
func (s *Service) ResultCache() ResultCache { return s.cache }

// DefaultResultCache picks the cache for a database: PostgreSQL's (shared by
// every node) or, for SQLite and a nil db, one in this process's memory.
func DefaultResultCache(db *models.DB, log *slog.Logger, budget ResultCacheBudget) ResultCache {
	if db != nil && db.Caps().SharedResultCache {
		c, err := NewPGResultCache(db, PGResultCacheConfig{Logger: log.With("component", "resultcache"), Budget: budget})
		if err == nil {
			return c
		}
	}
	return NewMemoryResultCache(budget)
}

// DB is the database the service runs on.
func (s *Service) DB() *models.DB { return s.db }

// Bus is where committed events go.
func (s *Service) Bus() events.Bus { return s.bus }

// Settings returns the current settings.
func (s *Service) Settings() Settings {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.settings
}

// SetSettings replaces the settings at runtime (operators and tests).
func (s *Service) SetSettings(st Settings) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settings = st
}

// mutate runs fn in one transaction and publishes what it emitted. With a
// TxBus on PostgreSQL the other nodes' payload is written to the event
// outbox inside the transaction (so it exists exactly when the change
// commits, never without it) and the relay sends it after the commit; this
// node's subscribers get the emissions after the commit. Nothing is
// published when fn or the commit fails.
func (s *Service) mutate(ctx context.Context, fn func(q *models.Q, em *events.Set) error) error {
	var em events.Set
	tb := s.txBus()
	err := s.db.Tx(ctx, func(q *models.Q) error {
		em = events.Set{}
		if err := fn(q, &em); err != nil {
			return err
		}
		if tb == nil || em.Len() == 0 {
			return nil
		}
		msg, err := tb.Notification(ctx, em.List())
		if err != nil {
			return err
		}
		return q.WriteOutbox(msg)
	})
	if err != nil {
		return err
	}
	if tb != nil {
		tb.Deliver(em.List())
		if em.Len() > 0 {
			s.relay.poke()
		}
		return nil
	}
	s.publish(ctx, em.List())
	return nil
}

// txBus is the bus when it publishes inside PostgreSQL transactions.
func (s *Service) txBus() events.TxBus {
	if tb, ok := s.bus.(events.TxBus); ok && s.db.Caps().Outbox && !s.Settings().NotifyAfterCommit {
		return tb
	}
	return nil
}

// publish hands committed emissions to the bus. A failure here cannot undo the
// commit, so it is logged and counted rather than failing the request.
func (s *Service) publish(ctx context.Context, ems []events.Emission) {
	if len(ems) == 0 {
		return
	}
	if err := s.bus.Publish(context.WithoutCancel(ctx), ems); err != nil {
		s.log.Error("publish events", "count", len(ems), "err", err)
	}
}

func isNotFound(err error) bool { return errors.Is(err, models.ErrNotFound) }

// notFound turns models.ErrNotFound into the given client error.
func notFound(err error, e *Error) error {
	if errors.Is(err, models.ErrNotFound) {
		return e
	}
	return err
}
