package joblib

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zndraw/joblib/internal/startstop"
	"github.com/zndraw/joblib/models"
)

// LeaderFence is the proof of leadership the sweeper's writes carry (see
// models.LeaderFence): node reaping, stale-worker cleanups, stuck @internal
// tasks, task retention and the audit purge all pass the fence of the
// Leader's last Hold, so that their statements match nothing once another
// node took the leadership over. A new leader-only step takes it as a
// parameter and hands it to its statements the same way.
type LeaderFence = models.LeaderFence

// Leader elects the sweeper. models.LeaderLease implements it: a lease row
// on the database clock, renewed at each probe, whose epoch moves on at
// each hand-over. (A session advisory lock cannot be the leadership: the
// database keeps it for a paused process as long as its connection lives.)
type Leader interface {
	// Hold takes the leadership if free or expired, or renews it, and
	// reports whether this process leads now and with which fence. An
	// error means the database could not be asked: the process then acts
	// as a follower.
	Hold(ctx context.Context) (LeaderFence, bool, error)
	// Release gives the leadership up.
	Release()
}

// SweeperConfig tunes a Sweeper. The zero value is fine.
type SweeperConfig struct {
	// Logger receives the sweeper's logs. Default: the service's.
	Logger *slog.Logger
	// Leader elects the sweeping node. Default: the leadership lease
	// "sweeper" held by this node's run, valid for
	// Settings.NodeLeaseTimeout after each renewal.
	Leader Leader
	// Now is the clock that times the guards (durations only, never compared
	// with database timestamps). Default: time.Now.
	Now func() time.Time
	// Probe is how often leadership and database health are checked between
	// sweeps. Default: the sweep interval, at most 1s.
	Probe time.Duration
	// Jitter bounds the random delay before the first run. Default 1s
	// (capped at the sweep interval); negative means none.
	Jitter time.Duration
	// NodeGrace is the disconnect grace the sockets of a lost node get,
	// counted from the moment its lease lapsed (JOBLIB_DISCONNECT_GRACE).
	NodeGrace time.Duration
}

// Sweep outcomes, as SweepEvent.Outcome and the metrics label.
const (
	SweepActed    = "acted"    // stale workers were cleaned
	SweepIdle     = "idle"     // nothing was stale
	SweepHeld     = "held"     // the outage guard held the sweep back
	SweepCapped   = "capped"   // the blast-radius cap held the sweep back
	SweepFollower = "follower" // another node is the sweeper
	SweepError    = "error"    // the sweep failed; it runs again next interval
)

// SweepOutcomes lists every outcome.
var SweepOutcomes = []string{SweepActed, SweepIdle, SweepHeld, SweepCapped, SweepFollower, SweepError}

// SweepEvent reports one sweep interval of a Sweeper.
type SweepEvent struct {
	Outcome string
	// Report is the sweep's report (acted, idle, capped, error).
	Report SweepReport
	Err    error
}

// Sweeper is the background service that cleans stale workers: a worker
// whose last heartbeat is older than Settings.WorkerTimeout by the
// database's clock is cleaned with path sweeper, every
// Settings.SweeperInterval, on the one node that holds the leader lock. It
// also fails @internal tasks stuck past Settings.InternalTaskTimeout,
// deletes audit rows past Settings.AuditRetention and finished tasks past
// their retention (Service.PruneTasks).
//
// Guards: no destructive sweep until this node has led, and the database
// has answered without error, for one full worker timeout — after a start,
// a failover or a database outage, workers get a full timeout to heartbeat
// again before anyone is judged. Above Settings.SweepMaxFraction the sweep
// records its plan as shadow audit rows and alerts instead of acting.
//
// Errors are logged and the loop goes on; Stop ends it.
type Sweeper struct {
	startstop.Base
	svc   *Service
	log   *slog.Logger
	cfg   SweeperConfig
	lead  Leader
	isLed atomic.Bool

	mu  sync.Mutex
	obs []func(SweepEvent)

	// Loop state, touched only by the loop goroutine.
	fence        LeaderFence // of the last Hold that led
	leaderSince  time.Time
	healthy      bool
	healthySince time.Time
	nextSweep    time.Time
	capped       bool
	heldLogged   bool
	lastPurge    time.Time
}

// NewSweeper builds a sweeper over a service. Start runs it.
func NewSweeper(svc *Service, cfg SweeperConfig) *Sweeper {
	if cfg.Logger == nil {
		cfg.Logger = svc.log
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Leader == nil {
		cfg.Leader = svc.db.NewLeaderLease("sweeper", svc.node.Run, svc.Settings().NodeLeaseTimeout)
	}
	if cfg.Jitter == 0 {
		cfg.Jitter = time.Second
	}
	return &Sweeper{svc: svc, log: cfg.Logger.With("component", "sweeper"), cfg: cfg, lead: cfg.Leader}
}

// OnSweep registers an observer of every sweep interval (metrics). It runs
// on the sweeper's goroutine and must not block.
func (sw *Sweeper) OnSweep(fn func(SweepEvent)) {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	sw.obs = append(sw.obs, fn)
}

// Leading reports whether this node is the sweeper now.
func (sw *Sweeper) Leading() bool { return sw.isLed.Load() }

// Start runs the sweeper in the background until Stop is called.
func (sw *Sweeper) Start(ctx context.Context) error {
	sctx, ok := sw.StartInit(ctx)
	if !ok {
		return nil
	}
	sw.Go(func() { sw.loop(sctx) })
	return nil
}

func (sw *Sweeper) loop(ctx context.Context) {
	defer func() {
		sw.lead.Release()
		sw.isLed.Store(false)
	}()
	sw.healthy, sw.healthySince = true, sw.cfg.Now()
	interval := sw.svc.Settings().SweeperInterval
	var first time.Duration
	if j := min(sw.cfg.Jitter, interval); j > 0 {
		first = rand.N(j)
	}
	timer := time.NewTimer(first)
	defer timer.Stop()
	// due fires at the earliest delayed task's run_at (while leading).
	due := time.NewTimer(time.Hour)
	due.Stop()
	defer due.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
			sw.tick(ctx)
			timer.Reset(sw.probe())
		case <-due.C:
		case <-sw.svc.sched.kicks:
		}
		sw.schedule(ctx, due)
	}
}

// schedule makes the due delayed tasks claimable and arms due at the next
// one's run_at, while this node leads (one read of the first entry of the
// delayed tasks' index; nothing while following).
func (sw *Sweeper) schedule(ctx context.Context, due *time.Timer) {
	due.Stop()
	if !sw.isLed.Load() {
		return
	}
	for range 2 {
		wait, ok, err := sw.svc.NextRunAt(ctx)
		if err != nil {
			if ctx.Err() == nil {
				sw.log.Error("read the next delayed task", "err", err)
				due.Reset(sw.probe())
			}
			return
		}
		if !ok {
			return
		}
		if wait > 0 {
			due.Reset(wait + time.Millisecond)
			return
		}
		if _, err := sw.svc.PromoteDueTasks(ctx, sw.fence); err != nil {
			if ctx.Err() == nil {
				sw.log.Error("promote due delayed tasks", "err", err)
				due.Reset(sw.probe())
			}
			return
		}
	}
	due.Reset(time.Millisecond) // more were due than one promotion took
}

// probe is the time between two ticks: the sweep interval, at most 1s and
// at most a third of the lease timeout (each tick renews the leadership).
func (sw *Sweeper) probe() time.Duration {
	if sw.cfg.Probe > 0 {
		return sw.cfg.Probe
	}
	st := sw.svc.Settings()
	return max(min(st.SweeperInterval, time.Second, st.NodeLeaseTimeout/3), 10*time.Millisecond)
}

// tick checks leadership and health and sweeps when the interval is due.
func (sw *Sweeper) tick(ctx context.Context) {
	st := sw.svc.Settings()
	now := sw.cfg.Now()
	due := !now.Before(sw.nextSweep)

	hctx, cancel := context.WithTimeout(ctx, min(max(sw.probe(), time.Second), 5*time.Second))
	fence, held, err := sw.lead.Hold(hctx)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		sw.unhealthy(err)
		sw.setLeader(false, LeaderFence{}, now)
		if due {
			sw.nextSweep = now.Add(st.SweeperInterval)
			sw.emit(SweepEvent{Outcome: SweepError, Err: err})
		}
		return
	}
	sw.healthyAt(now)
	sw.setLeader(held, fence, now)
	if held {
		sw.reapNodes(ctx, now, st.NodeLeaseTimeout)
	}
	if !due {
		return
	}
	sw.nextSweep = now.Add(st.SweeperInterval)
	if !held {
		sw.emit(SweepEvent{Outcome: SweepFollower})
		return
	}
	if wait := sw.guard(now, st.WorkerTimeout); wait > 0 {
		if !sw.heldLogged {
			sw.log.Info("sweep held until the database and leadership have been steady for one worker timeout",
				"timeout", st.WorkerTimeout, "remaining", wait)
			sw.heldLogged = true
		}
		sw.emit(SweepEvent{Outcome: SweepHeld})
		return
	}
	sw.heldLogged = false

	rep, err := sw.svc.Sweep(ctx, SweepParams{Path: PathSweeper, Cap: true, RecordShadow: !sw.capped, Leader: sw.fence})
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		sw.unhealthy(err)
		sw.log.Error("sweep failed; retrying next interval", "err", err, "cleaned", rep.Result.Cleaned)
		sw.emit(SweepEvent{Outcome: SweepError, Report: rep, Err: err})
		return
	}
	sw.capped = rep.Capped
	switch {
	case rep.Capped:
		sw.log.Error("sweep capped: too many workers are stale at once; acting on none (joblib sweep --fix acts)",
			"stale", rep.StaleWorkers, "total", rep.TotalWorkers, "max_fraction", st.SweepMaxFraction, "sweep_id", rep.SweepID)
		sw.emit(SweepEvent{Outcome: SweepCapped, Report: rep})
	case rep.Result.Cleaned > 0 || len(rep.StuckInternal) > 0 || len(rep.TimedOut) > 0:
		sw.emit(SweepEvent{Outcome: SweepActed, Report: rep})
	default:
		sw.emit(SweepEvent{Outcome: SweepIdle, Report: rep})
	}
	if st.AuditRetention > 0 && now.Sub(sw.lastPurge) >= min(time.Hour, st.AuditRetention) {
		n, err := sw.svc.PurgeAudit(ctx, sw.fence)
		if err != nil && ctx.Err() == nil {
			sw.log.Error("purge audit trail", "err", err)
		} else if err == nil {
			sw.lastPurge = now
			if n > 0 {
				sw.log.Info("audit trail purged", "rows", n, "retention", st.AuditRetention)
			}
		}
	}
	// Task retention: a separate step (retention.go), after the sweep.
	sw.pruneTasks(ctx)
}

// reapNodes releases the sockets of nodes whose lease lapsed, at every
// probe (node loss is detected within the lease timeout plus the grace, not
// the worker timeout). Its outage guard is one lease timeout of leadership
// and database health: every live node has renewed its lease by then, so
// a lease still lapsed is a dead node, never a database outage.
func (sw *Sweeper) reapNodes(ctx context.Context, now time.Time, leaseTimeout time.Duration) {
	if sw.guard(now, leaseTimeout) > 0 {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := sw.svc.ReapLostNodes(rctx, sw.cfg.NodeGrace, sw.fence); err != nil && ctx.Err() == nil {
		sw.log.Error("release the sockets of lost nodes", "err", err)
	}
}

// guard returns how long destructive sweeps must still wait: until this
// node has led, and the database has been healthy, for one worker timeout.
func (sw *Sweeper) guard(now time.Time, timeout time.Duration) time.Duration {
	since := sw.leaderSince
	if sw.healthySince.After(since) {
		since = sw.healthySince
	}
	return since.Add(timeout).Sub(now)
}

func (sw *Sweeper) unhealthy(err error) {
	if sw.healthy {
		sw.log.Warn("database check failed; destructive sweeps wait for one worker timeout of health", "err", err)
	}
	sw.healthy = false
}

// healthyAt records a successful database check.
func (sw *Sweeper) healthyAt(now time.Time) {
	if !sw.healthy {
		sw.healthy = true
		sw.healthySince = now
		sw.log.Info("database reachable again")
	}
}

// setLeader records the outcome of a Hold. A new epoch while leading is a
// new leadership too: this node's lease lapsed (it stalled) and it took the
// leadership anew, so the guards start over (its workers could not
// heartbeat through it while it stalled).
func (sw *Sweeper) setLeader(held bool, fence LeaderFence, now time.Time) {
	was := sw.isLed.Swap(held)
	renewed := held && was && fence.Epoch != sw.fence.Epoch
	sw.fence = fence
	switch {
	case held && (!was || renewed):
		sw.leaderSince = now
		if renewed {
			sw.log.Warn("this node's leadership lapsed (it stalled) and was taken anew; destructive sweeps wait again",
				"node", sw.svc.node.ID, "epoch", fence.Epoch)
		}
		sw.log.Info("this node is the sweeper", "node", sw.svc.node.ID, "epoch", fence.Epoch)
	case !held && was:
		sw.log.Warn("this node is no longer the sweeper", "node", sw.svc.node.ID)
	}
}

func (sw *Sweeper) emit(e SweepEvent) {
	sw.mu.Lock()
	obs := sw.obs
	sw.mu.Unlock()
	for _, o := range obs {
		o(e)
	}
}
