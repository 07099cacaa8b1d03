package joblib

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/taskstatus"
	"github.com/zndraw/joblib/models"
)

// Dashboard bounds: the snapshot lists at most this many of each kind (the
// totals are exact).
const (
	DashMaxWorkers   = 200
	DashMaxJobs      = 200
	DashMaxProviders = 200
	DashLatestTasks  = 25
	DashLatestFailed = 10
	DashCleanups     = 20
	// DashWindow is the window of the cleanup and false-positive counts.
	DashWindow = 24 * time.Hour
)

// Dashboard is the database side of the live dashboard (/ui): the fleet as
// every node sees it. The server adds what only a node knows (its sockets,
// its sweeper) before sending it.
type Dashboard struct {
	// DBNow is the database's clock when the snapshot was read: heartbeat
	// ages are judged against it (the page adds the time since).
	DBNow          events.Time      `json:"db_now"`
	Settings       DashSettings     `json:"settings"`
	Totals         DashTotals       `json:"totals"`
	Rooms          []DashRoom       `json:"rooms"`
	Workers        []DashWorker     `json:"workers"`
	Jobs           []DashJob        `json:"jobs"`
	Providers      []DashProvider   `json:"providers"`
	LatestTasks    []Task           `json:"latest_tasks"`
	FailedTasks    []Task           `json:"failed_tasks"`
	Cleanups       []DashCleanup    `json:"cleanups"`
	FalsePositives []DashCleanup    `json:"false_positives"`
	CleanupCounts  map[string]int64 `json:"cleanup_counts"`
	Nodes          []DashNode       `json:"nodes"`
	// Timeouts are the latest tasks the sweeper timed out, with the
	// evidence (newest first, at most DashCleanups).
	Timeouts []DashTimeout `json:"timeouts"`
}

// DashTimeout is one task the sweeper timed out, with its evidence: the
// limit it passed, its claim, its last progress, its deadline and the
// database's clock at the decision (all database time).
type DashTimeout struct {
	TaskID     uuid.UUID   `json:"task_id"`
	Job        string      `json:"job"`
	RoomID     string      `json:"room_id"`
	WorkerID   *uuid.UUID  `json:"worker_id"`
	Limit      string      `json:"limit"`
	Seconds    int         `json:"seconds"`
	Outcome    string      `json:"outcome"`
	Attempt    int         `json:"attempt"`
	ClaimedAt  events.Time `json:"claimed_at"`
	ProgressAt events.Time `json:"progress_at"`
	DeadlineAt events.Time `json:"deadline_at"`
	DBNow      events.Time `json:"db_now"`
}

// DashSettings are the thresholds the page shows next to the evidence.
type DashSettings struct {
	WorkerTimeoutMs    int64   `json:"worker_timeout_ms"`
	SweeperIntervalMs  int64   `json:"sweeper_interval_ms"`
	SweepMaxFraction   float64 `json:"sweep_max_fraction"`
	SweepCapMinWorkers int     `json:"sweep_cap_min_workers"`
}

// DashTotals are exact counts over the whole fleet.
type DashTotals struct {
	Workers   int64            `json:"workers"`
	Jobs      int64            `json:"jobs"`
	Providers int64            `json:"providers"`
	Tasks     map[string]int64 `json:"tasks"`
	// FalsePositives counts the reaped workers heard from again among the
	// cleanups of the last DashWindow.
	FalsePositives int64 `json:"false_positives"`
}

// DashRoom is one room's share of the fleet.
type DashRoom struct {
	RoomID    string           `json:"room_id"`
	Jobs      int              `json:"jobs"`
	Providers int              `json:"providers"`
	Workers   int              `json:"workers"`
	Tasks     map[string]int64 `json:"tasks"`
}

// DashWorker is a worker with what an operator asks about it.
type DashWorker struct {
	ID            uuid.UUID   `json:"id"`
	Owner         string      `json:"owner"`
	LastHeartbeat events.Time `json:"last_heartbeat"`
	CreatedAt     events.Time `json:"created_at"`
	NodeID        *string     `json:"node_id"`
	NodeRun       *string     `json:"node_run"`
	BoundAt       events.Time `json:"bound_at"`
	SessionEpoch  int64       `json:"session_epoch"`
	Jobs          []string    `json:"jobs"`
	Rooms         []string    `json:"rooms"`
	ActiveTasks   int64       `json:"active_tasks"`
	// Socket is the id of the socket that holds it, when that socket is on
	// the node that sent the snapshot (filled by the server).
	Socket string `json:"socket,omitempty"`
}

// DashJob is a live job with its queue.
type DashJob struct {
	FullName     string `json:"full_name"`
	RoomID       string `json:"room_id"`
	OnWorkerLoss string `json:"on_worker_loss"`
	MaxAttempts  int    `json:"max_attempts"`
	Workers      int64  `json:"workers"`
	Pending      int64  `json:"pending"`
	Active       int64  `json:"active"`
}

// DashProvider is a provider and who serves it.
type DashProvider struct {
	FullName string    `json:"full_name"`
	RoomID   string    `json:"room_id"`
	WorkerID uuid.UUID `json:"worker_id"`
	Owner    string    `json:"owner"`
}

// DashCleanup is one cleanup with its evidence: who decided (path), the
// worker's last heartbeat and the database's clock at the decision (both
// database time), and the threshold it was judged against.
type DashCleanup struct {
	ID            uuid.UUID   `json:"id"`
	Path          string      `json:"path"`
	WorkerID      uuid.UUID   `json:"worker_id"`
	Owner         string      `json:"owner"`
	SweepID       *uuid.UUID  `json:"sweep_id"`
	LastHeartbeat events.Time `json:"last_heartbeat"`
	DBNow         events.Time `json:"db_now"`
	ThresholdMs   *int64      `json:"threshold_ms"`
	// SilenceMs is DBNow minus LastHeartbeat: how long the worker had been
	// silent when it was judged.
	SilenceMs     *int64      `json:"silence_ms"`
	TasksFailed   int         `json:"tasks_failed"`
	TasksRequeued int         `json:"tasks_requeued"`
	Providers     int         `json:"providers"`
	JobsDeleted   int         `json:"jobs_deleted"`
	Shadow        bool        `json:"shadow"`
	HeardAt       events.Time `json:"heard_at"`
	HeardVia      *string     `json:"heard_via"`
}

// DashNode is a node lease.
type DashNode struct {
	NodeID    string      `json:"node_id"`
	Run       string      `json:"run"`
	Addr      string      `json:"addr"`
	StartedAt events.Time `json:"started_at"`
	ExpiresAt events.Time `json:"expires_at"`
	Live      bool        `json:"live"`
}

// Dashboard reads the fleet's state for the dashboard. Every read is
// bounded (see the Dash* limits), so its cost does not grow with the tasks
// or audit tables; it runs in one read transaction so the counts agree.
func (s *Service) Dashboard(ctx context.Context) (Dashboard, error) {
	st := s.Settings()
	d := Dashboard{
		Settings: DashSettings{WorkerTimeoutMs: st.WorkerTimeout.Milliseconds(), SweeperIntervalMs: st.SweeperInterval.Milliseconds(),
			SweepMaxFraction: st.SweepMaxFraction, SweepCapMinWorkers: st.SweepCapMinWorkers},
	}
	err := s.db.Tx(ctx, func(q *models.Q) error {
		d.Rooms, d.Workers, d.Jobs, d.Providers, d.LatestTasks, d.FailedTasks, d.Cleanups, d.FalsePositives, d.Nodes =
			nil, nil, nil, nil, nil, nil, nil, nil, nil
		now, err := q.DBNow()
		if err != nil {
			return err
		}
		d.DBNow = wireTime(now)
		if d.Totals.Tasks, err = q.CountTasksByStatus(); err != nil {
			return err
		}
		ws, nw, err := q.DashWorkers(DashMaxWorkers)
		if err != nil {
			return err
		}
		d.Totals.Workers = nw
		ids := make([]uuid.UUID, len(ws))
		for i, w := range ws {
			ids[i] = w.ID
		}
		links, err := q.DashWorkerJobs(ids)
		if err != nil {
			return err
		}
		byWorker := map[uuid.UUID][]models.WorkerJobLink{}
		for _, l := range links {
			byWorker[l.WorkerID] = append(byWorker[l.WorkerID], l)
		}
		rooms := map[string]*DashRoom{}
		room := func(id string) *DashRoom {
			r := rooms[id]
			if r == nil {
				r = &DashRoom{RoomID: id, Tasks: map[string]int64{}}
				rooms[id] = r
			}
			return r
		}
		d.Workers = make([]DashWorker, 0, len(ws))
		for _, w := range ws {
			v := DashWorker{ID: w.ID, Owner: deref(w.Owner), LastHeartbeat: wireTime(w.LastHeartbeat), CreatedAt: wireTime(w.CreatedAt),
				NodeID: w.NodeID, NodeRun: w.NodeRun, BoundAt: wireTime(w.BoundAt), SessionEpoch: w.SessionEpoch,
				ActiveTasks: w.ActiveTasks, Jobs: []string{}, Rooms: []string{}}
			for _, l := range byWorker[w.ID] {
				v.Jobs = append(v.Jobs, l.RoomID+":"+l.Category+":"+l.Name)
				if len(v.Rooms) == 0 || v.Rooms[len(v.Rooms)-1] != l.RoomID {
					v.Rooms = append(v.Rooms, l.RoomID)
					room(l.RoomID).Workers++
				}
			}
			d.Workers = append(d.Workers, v)
		}
		js, nj, err := q.DashJobs(DashMaxJobs)
		if err != nil {
			return err
		}
		d.Totals.Jobs = nj
		d.Jobs = make([]DashJob, len(js))
		for i, j := range js {
			d.Jobs[i] = DashJob{FullName: j.RoomID + ":" + j.Category + ":" + j.Name, RoomID: j.RoomID, OnWorkerLoss: j.OnWorkerLoss,
				MaxAttempts: j.MaxAttempts, Workers: j.Workers, Pending: j.Pending, Active: j.Active}
			room(j.RoomID).Jobs++
		}
		ps, np, err := q.DashProviders(DashMaxProviders)
		if err != nil {
			return err
		}
		d.Totals.Providers = np
		d.Providers = make([]DashProvider, len(ps))
		for i, p := range ps {
			d.Providers[i] = DashProvider{FullName: p.RoomID + ":" + p.Category + ":" + p.Name, RoomID: p.RoomID, WorkerID: p.WorkerID, Owner: deref(p.Owner)}
			room(p.RoomID).Providers++
		}
		counts, err := q.DashRoomTaskCounts()
		if err != nil {
			return err
		}
		for _, c := range counts {
			room(c.RoomID).Tasks[c.Status] = c.N
		}
		for _, r := range rooms {
			d.Rooms = append(d.Rooms, *r)
		}
		sort.Slice(d.Rooms, func(i, j int) bool { return d.Rooms[i].RoomID < d.Rooms[j].RoomID })
		if d.LatestTasks, err = dashTasks(q, "", DashLatestTasks); err != nil {
			return err
		}
		if d.FailedTasks, err = dashTasks(q, models.StatusFailed, DashLatestFailed); err != nil {
			return err
		}
		cs, err := q.DashCleanups(DashCleanups)
		if err != nil {
			return err
		}
		d.Cleanups = dashCleanups(cs)
		fps, nfp, err := q.DashFalsePositives(DashWindow, DashCleanups)
		if err != nil {
			return err
		}
		d.FalsePositives, d.Totals.FalsePositives = dashCleanups(fps), nfp
		pcs, err := q.DashCleanupCounts(DashWindow)
		if err != nil {
			return err
		}
		d.CleanupCounts = make(map[string]int64, len(pcs))
		for _, pc := range pcs {
			d.CleanupCounts[pc.Path] = pc.N
		}
		if d.Timeouts, err = dashTimeouts(q); err != nil {
			return err
		}
		ns, err := q.ListNodes()
		if err != nil {
			return err
		}
		d.Nodes = make([]DashNode, len(ns))
		for i, n := range ns {
			d.Nodes[i] = DashNode{NodeID: n.NodeID, Run: n.Run, Addr: n.Addr, StartedAt: wireTime(n.StartedAt), ExpiresAt: wireTime(n.ExpiresAt), Live: n.Live}
		}
		return nil
	})
	if err != nil {
		return Dashboard{}, err
	}
	if d.Rooms == nil {
		d.Rooms = []DashRoom{}
	}
	return d, nil
}

func dashTasks(q *models.Q, status string, limit int) ([]Task, error) {
	ts, err := q.DashLatestTasks(status, limit)
	if err != nil {
		return nil, err
	}
	out := make([]Task, len(ts))
	for i, t := range ts {
		out[i] = taskView(t)
		out[i].Payload = nil // the dashboard never shows payloads
		out[i].Result = nil
	}
	return out, nil
}

// dashTimeouts reads the latest timeouts from their audit rows.
func dashTimeouts(q *models.Q) ([]DashTimeout, error) {
	es, err := q.ListAuditLog(AuditTaskTimeout, DashCleanups)
	if err != nil {
		return nil, err
	}
	out := make([]DashTimeout, 0, len(es))
	for _, e := range es {
		var v DashTimeout // the audit detail has the same fields
		if err := json.Unmarshal([]byte(e.Detail), &v); err != nil {
			return nil, fmt.Errorf("read timeout audit %s: %w", e.ID, err)
		}
		if e.SubjectID != nil {
			v.TaskID = *e.SubjectID
		}
		out = append(out, v)
	}
	return out, nil
}

func dashCleanups(cs []models.DashCleanup) []DashCleanup {
	out := make([]DashCleanup, len(cs))
	for i, c := range cs {
		v := DashCleanup{ID: c.ID, Path: c.Path, WorkerID: c.WorkerID, Owner: deref(c.Owner), SweepID: c.SweepID,
			LastHeartbeat: wireTime(c.LastHeartbeat), DBNow: wireTime(c.DBNow), ThresholdMs: c.ThresholdMs,
			TasksFailed: c.TasksFailed, TasksRequeued: c.TasksRequeued, Providers: c.Providers, JobsDeleted: c.JobsDeleted,
			Shadow: c.Shadow, HeardAt: wireTime(c.HeardAt), HeardVia: c.HeardVia}
		if !c.LastHeartbeat.IsZero() && !c.DBNow.IsZero() {
			ms := c.DBNow.Sub(c.LastHeartbeat.Time).Milliseconds()
			v.SilenceMs = &ms
		}
		out[i] = v
	}
	return out
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Audit actions of the dashboard's operator actions (besides AuditTaskRetry).
const (
	// AuditTaskCancel: an operator cancelled a task.
	AuditTaskCancel = "task_cancel"
	// AuditWorkerOperatorDelete: an operator deleted a worker (dashboard).
	AuditWorkerOperatorDelete = "worker_delete"
)

// ErrCancelledByOperator is the error recorded on a task an operator cancelled.
const ErrCancelledByOperator = "Cancelled by an operator"

// CancelTask cancels a pending, claimed or running task (an operator
// action): it becomes cancelled with an error naming the operator's action,
// an audit_log row names the actor, the task's status event is published,
// and the worker holding it gets task_cancelled on its socket, on whichever
// node it is.
func (s *Service) CancelTask(ctx context.Context, id uuid.UUID, actor string) (Task, error) {
	s.progress.flush(id) // its last progress goes before its end
	var out Task
	err := s.mutate(ctx, func(q *models.Q, em *events.Set) error {
		t, err := q.GetTask(id)
		if err != nil {
			return notFound(err, errf(CodeTaskNotFound, "Task '%s' not found", id))
		}
		if !taskstatus.Allowed(t.Status, models.StatusCancelled) {
			return errf(CodeInvalidTaskTransition, "Cannot cancel a task in status '%s'", t.Status)
		}
		msg := ErrCancelledByOperator
		ok, err := q.TransitionTask(id, t.Status, models.StatusCancelled, nil, &msg)
		if err != nil {
			return err
		}
		if !ok {
			return errf(CodeInvalidTaskTransition, "Task '%s' changed while cancelling", id)
		}
		if err := audit(q, AuditTaskCancel, &id, actor, map[string]any{"from": t.Status, "job": t.JobFullName(), "room_id": t.RoomID}); err != nil {
			return err
		}
		if t.WorkerID == nil {
			orphans, err := q.SoftDeleteOrphanJobs([]uuid.UUID{t.JobID})
			if err != nil {
				return err
			}
			for _, j := range orphans {
				em.Add(events.Room(j.RoomID), events.JobsInvalidate{})
			}
		}
		nt, err := q.GetTask(id)
		if err != nil {
			return err
		}
		out = taskView(nt)
		em.Add(events.Room(out.RoomID), statusEvent(out))
		if t.WorkerID != nil {
			em.Add(events.WorkerRoom(t.WorkerID.String()), events.TaskCancelled{TaskID: id.String(), Reason: ErrCancelledByOperator})
		}
		return nil
	})
	return out, err
}

// OperatorDeleteWorker removes a worker on an operator's behalf: the worker
// goes through CleanupWorker (path graceful: a decision, not a detection,
// so a later heartbeat of it is not counted as a false positive), and an
// audit_log row names the actor and what the cleanup did.
func (s *Service) OperatorDeleteWorker(ctx context.Context, id uuid.UUID, actor string) (CleanupResult, error) {
	w, err := s.db.Q(ctx).GetWorker(id)
	if err != nil {
		return CleanupResult{}, notFound(err, s.workerGone(id))
	}
	res, err := s.CleanupWorker(ctx, id, CleanupParams{Path: PathGraceful})
	if err != nil {
		return res, err
	}
	if res.Cleaned == 0 {
		return res, s.workerGone(id)
	}
	detail, err := json.Marshal(map[string]any{"owner_id": w.UserID, "node_id": w.NodeID, "tasks_failed": res.TasksFailed,
		"tasks_requeued": res.TasksRequeued, "orphan_jobs": res.OrphanJobs})
	if err != nil {
		return res, fmt.Errorf("encode worker delete audit: %w", err)
	}
	if err := s.db.Q(ctx).InsertAudit(AuditWorkerOperatorDelete, &id, actor, string(detail)); err != nil {
		return res, err
	}
	return res, nil
}
