package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/server/sio"
	"github.com/zndraw/joblib/web"
)

// The live dashboard (/ui): a superuser's page that follows the fleet by
// push. Its sockets join dashboardRoom (join_dashboard, superusers only) and
// get a dashboard_update with the whole snapshot whenever something changed,
// at most once per dashboardMinGap: events only mark the snapshot dirty,
// and one goroutine recomputes it (a bounded set of reads) and emits it to
// the room, so that the cost is per update, never per event, and nothing
// is read while nobody watches. Emitting never blocks: a dashboard socket
// that cannot keep up is dropped as a slow consumer, like any other.

const (
	// dashboardRoom is the Socket.IO room of the dashboard sockets (not a
	// "room:" room: no client can join it with join_room).
	dashboardRoom = "dashboard"
	// dashboardEvent is the pushed snapshot.
	dashboardEvent = "dashboard_update"
	// dashboardMinGap is the least time between two recomputes (at most
	// four updates a second).
	dashboardMinGap = 250 * time.Millisecond
	// dashboardRefresh is the recompute period while somebody watches and
	// nothing else triggered one: it carries what has no event (heartbeats,
	// other nodes' worker registrations, node leases). The page ages
	// heartbeats itself between updates.
	dashboardRefresh = 5 * time.Second
)

// DashboardView is what the dashboard receives: the fleet (from the
// database, the same on every node) and what this node knows about its own
// sockets and sweeper.
type DashboardView struct {
	// Seq orders the snapshots of one node: the page ignores an older one
	// that arrives after a newer one (the join's ack and a push may cross).
	Seq  uint64 `json:"seq"`
	Node string `json:"node"`
	joblib.Dashboard
	Sweeper SweeperView `json:"sweeper"`
	Sockets SocketsView `json:"sockets"`
	// Trends is the last hour per minute (see joblib.Trends): completed
	// and failed tasks (every node's, from the bus), pending depth (as
	// the snapshots saw it), claim latency and cleanups (this node's).
	Trends joblib.TrendSeries `json:"trends"`
	// TookMs is how long the snapshot took to read.
	TookMs float64 `json:"took_ms"`
}

// SweeperView is this node's sweeper as the dashboard shows it.
type SweeperView struct {
	// Observed is false when this process runs no sweeper (tests).
	Observed bool `json:"observed"`
	// Leading: this node holds the sweeper lock.
	Leading bool `json:"leading"`
	// LastOutcome is the outcome of the latest interval (acted, idle, held,
	// capped, follower, error) and LastAt when it was.
	LastOutcome string      `json:"last_outcome,omitempty"`
	LastAt      events.Time `json:"last_at"`
	// LastSweep is the latest sweep that ran (acted, idle or capped).
	LastSweep *SweepRunView `json:"last_sweep"`
	// OutageGuard: the latest interval was held because leadership or the
	// database have not been steady for one worker timeout.
	OutageGuard bool `json:"outage_guard"`
	// Capped: the latest sweep was held back by the blast-radius cap.
	Capped bool   `json:"capped"`
	Error  string `json:"error,omitempty"`
}

// SweepRunView is one sweep that ran.
type SweepRunView struct {
	At           events.Time `json:"at"`
	Outcome      string      `json:"outcome"`
	SweepID      uuid.UUID   `json:"sweep_id"`
	TookMs       float64     `json:"took_ms"`
	Cleaned      int         `json:"cleaned"`
	StaleWorkers int64       `json:"stale_workers"`
	TotalWorkers int64       `json:"total_workers"`
}

// SocketsView is this node's Socket.IO side.
type SocketsView struct {
	Open int `json:"open"`
	// Disconnects counts this node's closed sockets by reason since start;
	// "slow consumer" are the ones dropped for not reading their events.
	Disconnects  map[string]int64 `json:"disconnects"`
	SlowConsumer int64            `json:"slow_consumer"`
}

// dashHub keeps the dashboard channel of one node.
type dashHub struct {
	rt    *Realtime
	dirty chan struct{}
	seq   atomic.Uint64

	mu          sync.Mutex
	sweeper     SweeperView
	disconnects map[string]int64
	last        *DashboardView // the latest snapshot computed
	lastAt      time.Time
	lastBody    []byte // its JSON without seq, db_now and took_ms: unchanged snapshots are not re-sent
}

func newDashHub(rt *Realtime) *dashHub {
	return &dashHub{rt: rt, dirty: make(chan struct{}, 1), disconnects: map[string]int64{}}
}

// poke marks the snapshot dirty; it never blocks.
func (h *dashHub) poke() {
	select {
	case h.dirty <- struct{}{}:
	default:
	}
}

func (h *dashHub) disconnected(reason string) {
	h.mu.Lock()
	h.disconnects[reason]++
	h.mu.Unlock()
	h.poke()
}

// loop recomputes and emits the snapshot while the room has members.
func (h *dashHub) loop() {
	t := time.NewTicker(dashboardRefresh)
	defer t.Stop()
	for {
		select {
		case <-h.rt.stop:
			return
		case <-h.dirty:
		case <-t.C:
		}
		if h.rt.io.RoomSize(dashboardRoom) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(h.rt.ctx, 10*time.Second)
		start := time.Now()
		v, changed, err := h.compute(ctx)
		took := time.Since(start)
		cancel()
		switch {
		case err != nil:
			if h.rt.ctx.Err() == nil {
				h.rt.log.Error("dashboard snapshot", "err", err)
			}
		case changed:
			if err := h.rt.io.EmitTo(dashboardRoom, dashboardEvent, v); err != nil {
				h.rt.log.Error("emit dashboard update", "err", err)
			}
		}
		// Coalesce: whatever happens during the gap is one recompute. On a
		// fleet whose snapshot is slow to read the gap grows with it, so
		// that reading snapshots takes at most a fifth of the time.
		select {
		case <-h.rt.stop:
			return
		case <-time.After(max(dashboardMinGap, 4*took)):
		}
	}
}

// compute reads a fresh snapshot; changed is false when it says the same
// as the previous one (only the clock moved).
func (h *dashHub) compute(ctx context.Context) (*DashboardView, bool, error) {
	start := time.Now()
	seq := h.seq.Add(1)
	d, err := h.rt.svc.Dashboard(ctx)
	if err != nil {
		return nil, false, err
	}
	trends := h.rt.svc.Trends()
	trends.Pending(d.Totals.Tasks["pending"])
	v := &DashboardView{Seq: seq, Node: h.rt.svc.Node().ID, Dashboard: d, Trends: trends.Series()}
	h.rt.mu.Lock()
	sockets := make(map[uuid.UUID]string, len(h.rt.bound))
	for id, s := range h.rt.bound {
		sockets[id] = s.ID()
	}
	h.rt.mu.Unlock()
	for i := range v.Workers {
		v.Workers[i].Socket = sockets[v.Workers[i].ID]
	}
	h.mu.Lock()
	v.Sweeper = h.sweeper
	v.Sockets = SocketsView{Open: h.rt.io.NumSockets(), Disconnects: make(map[string]int64, len(h.disconnects)),
		SlowConsumer: h.disconnects[sio.ReasonSlowConsumer]}
	for k, n := range h.disconnects {
		v.Sockets.Disconnects[k] = n
	}
	h.mu.Unlock()

	// Compare without what changes every time.
	cmp := *v
	cmp.Seq, cmp.DBNow, cmp.TookMs = 0, events.Time{}, 0
	body, err := json.Marshal(cmp)
	if err != nil {
		return nil, false, err
	}
	v.TookMs = float64(time.Since(start).Microseconds()) / 1000
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.last != nil && h.last.Seq > seq {
		return h.last, false, nil // a newer one was computed meanwhile
	}
	changed := !bytes.Equal(body, h.lastBody)
	h.last, h.lastAt, h.lastBody = v, time.Now(), body
	return v, changed, nil
}

// current returns a snapshot at most dashboardMinGap old (a join's answer).
func (h *dashHub) current(ctx context.Context) (*DashboardView, error) {
	h.mu.Lock()
	if h.last != nil && time.Since(h.lastAt) < dashboardMinGap {
		v := h.last
		h.mu.Unlock()
		return v, nil
	}
	h.mu.Unlock()
	v, _, err := h.compute(ctx)
	return v, err
}

// observeSweep records a sweeper interval.
func (h *dashHub) observeSweep(sw *joblib.Sweeper, e joblib.SweepEvent) {
	h.mu.Lock()
	prev := h.sweeper
	s := &h.sweeper
	s.Observed, s.Leading = true, sw.Leading()
	s.LastOutcome, s.LastAt = e.Outcome, events.Time{Time: time.Now().UTC()}
	s.OutageGuard = e.Outcome == joblib.SweepHeld
	s.Error = ""
	if e.Err != nil {
		s.Error = e.Err.Error()
	}
	switch e.Outcome {
	case joblib.SweepActed, joblib.SweepIdle, joblib.SweepCapped:
		s.Capped = e.Outcome == joblib.SweepCapped
		s.LastSweep = &SweepRunView{At: s.LastAt, Outcome: e.Outcome, SweepID: e.Report.SweepID, TookMs: float64(e.Report.Took.Microseconds()) / 1000,
			Cleaned: e.Report.Result.Cleaned, StaleWorkers: e.Report.StaleWorkers, TotalWorkers: e.Report.TotalWorkers}
	case joblib.SweepFollower:
		s.Capped = false
	}
	// An idle interval that changes nothing visible is not worth an update.
	quiet := prev.Observed && prev.Leading == s.Leading && prev.LastOutcome == s.LastOutcome && e.Outcome != joblib.SweepActed
	h.mu.Unlock()
	if !quiet {
		h.poke()
	}
}

// ObserveSweeper shows sw on the dashboard: leadership, the latest sweep,
// the outage guard and the blast-radius cap.
func (rt *Realtime) ObserveSweeper(sw *joblib.Sweeper) {
	rt.dash.mu.Lock()
	rt.dash.sweeper = SweeperView{Observed: true, Leading: sw.Leading()}
	rt.dash.mu.Unlock()
	sw.OnSweep(func(e joblib.SweepEvent) { rt.dash.observeSweep(sw, e) })
}

// startDashboard wires the triggers: every committed event (of any node),
// cleanups and false positives of this node, REST worker registrations.
func (rt *Realtime) startDashboard(s *Server) {
	poke := rt.dash.poke
	s.dashPoke.Store(&poke)
	snap := rt.dash.current
	s.dashSnapshot.Store(&snap)
	rt.svc.OnCleanup(func(path string, r joblib.CleanupResult) {
		rt.svc.Trends().Cleanup(path, len(r.Workers))
		rt.dash.poke()
	})
	rt.svc.OnFalsePositive(func(joblib.FalsePositive) { rt.dash.poke() })
}

// pokeDashboard tells the dashboard of this node that something without an
// event changed (a worker registered).
func (s *Server) pokeDashboard() {
	if f := s.dashPoke.Load(); f != nil {
		(*f)()
	}
}

// joinDashboard is the socket's join_dashboard: superusers only.
func (rt *Realtime) joinDashboard(ctx context.Context, s *sio.Socket, st *connState) ack {
	if st.anon {
		return problemAck(joblib.CodeUnauthorized, "Unauthorized")
	}
	if !st.p.Superuser {
		return problemAck(joblib.CodeForbidden, errDashboardForbidden)
	}
	if err := s.Join(dashboardRoom); err != nil {
		return joinErrAck(err)
	}
	v, err := rt.dash.current(ctx)
	if err != nil {
		s.Leave(dashboardRoom)
		rt.log.Error("dashboard snapshot", "err", err)
		return ack{Status: 503, Detail: "dashboard snapshot unavailable"}
	}
	return ack{OK: true, Dashboard: v}
}

const errDashboardForbidden = "The dashboard shows every user's workers and tasks: it is for superusers only"

// --- REST: the snapshot and the operator actions (superusers only)

func (s *Server) routesDashboard(write func(http.HandlerFunc) http.HandlerFunc) {
	m := s.routeMux()
	m.HandleFunc("GET "+prefix+"/dashboard", s.dbBudget(s.cfg.ReadDBTimeout, s.dashboardSnapshot))
	m.HandleFunc("POST "+prefix+"/dashboard/tasks/{id}/retry", write(s.dashboardAction(actionRetry)))
	m.HandleFunc("POST "+prefix+"/dashboard/tasks/{id}/cancel", write(s.dashboardAction(actionCancel)))
	m.HandleFunc("DELETE "+prefix+"/dashboard/workers/{id}", write(s.dashboardAction(actionDeleteWorker)))
	m.HandleFunc("POST "+prefix+"/dashboard/sweep", write(s.dashboardSweep))
	ui := web.Handler()
	m.Handle("GET /ui/", http.StripPrefix("/ui", ui))
	m.HandleFunc("GET /ui", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ui/", http.StatusMovedPermanently) })
}

// superuser authenticates the caller and answers 403 unless a superuser.
func (s *Server) superuser(w http.ResponseWriter, r *http.Request) (joblib.Principal, bool) {
	p, ok := s.principal(w, r)
	if !ok {
		return p, false
	}
	if !p.Superuser {
		writeProblem(w, newProblem(joblib.CodeForbidden, errDashboardForbidden))
		return p, false
	}
	return p, true
}

func (s *Server) dashboardSnapshot(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.superuser(w, r); !ok {
		return
	}
	if f := s.dashSnapshot.Load(); f != nil {
		v, err := (*f)(r.Context())
		s.answer(w, r, http.StatusOK, v, err)
		return
	}
	// No Socket.IO endpoint on this server: the database part only.
	d, err := s.svc.Dashboard(r.Context())
	if err == nil {
		s.svc.Trends().Pending(d.Totals.Tasks["pending"])
	}
	s.answer(w, r, http.StatusOK, DashboardView{Node: s.svc.Node().ID, Dashboard: d, Trends: s.svc.Trends().Series()}, err)
}

type dashboardActionKind string

const (
	actionRetry        dashboardActionKind = "retry_task"
	actionCancel       dashboardActionKind = "cancel_task"
	actionDeleteWorker dashboardActionKind = "delete_worker"
)

// DeleteWorkerResult answers an operator's worker deletion.
type DeleteWorkerResult struct {
	WorkerID      uuid.UUID `json:"worker_id"`
	TasksFailed   int       `json:"tasks_failed"`
	TasksRequeued int       `json:"tasks_requeued"`
	OrphanJobs    int       `json:"orphan_jobs"`
}

// dashboardAction runs an operator action: superusers only, audited in the
// audit_log (actor "dashboard:<user>") and logged with the actor.
func (s *Server) dashboardAction(kind dashboardActionKind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, ok := s.superuser(w, r)
		if !ok {
			return
		}
		id, ok := pathUUID(w, r, "id")
		if !ok {
			return
		}
		actor := operatorActor(p)
		var out any
		var err error
		switch kind {
		case actionRetry:
			out, err = s.svc.RetryTask(r.Context(), id, actor)
		case actionCancel:
			out, err = s.svc.CancelTask(r.Context(), id, actor)
		case actionDeleteWorker:
			var res joblib.CleanupResult
			res, err = s.svc.OperatorDeleteWorker(r.Context(), id, actor)
			out = DeleteWorkerResult{WorkerID: id, TasksFailed: res.TasksFailed, TasksRequeued: res.TasksRequeued, OrphanJobs: res.OrphanJobs}
		}
		if err != nil {
			level := "refused"
			if _, isClient := joblib.AsError(err); !isClient && !errors.Is(err, context.Canceled) {
				level = "failed"
			}
			s.log.Warn("operator action "+level, "action", string(kind), "actor", p.Name, "target", id, "err", err)
			s.fail(w, r, err)
			return
		}
		s.log.Info("operator action", "action", string(kind), "actor", p.Name, "user_id", p.ID, "target", id)
		s.pokeDashboard()
		s.answer(w, r, http.StatusOK, out, nil)
	}
}
