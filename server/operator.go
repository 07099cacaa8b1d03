package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/server/sio"
)

// The operator side of the admin API: `joblib sweep --fix`, `tasks retry`,
// `tasks cancel` and `workers delete` send their action here when a server
// runs, so that it takes effect exactly as the dashboard's does (events
// published by the server, metrics counted, sockets of removed workers
// closed).

// SweepWorker is one worker of a sweep, with its evidence.
type SweepWorker struct {
	ID            uuid.UUID   `json:"id"`
	UserID        uuid.UUID   `json:"user_id"`
	UserName      string      `json:"user_name"`
	LastHeartbeat time.Time   `json:"last_heartbeat"`
	DBNow         time.Time   `json:"db_now"`
	AgeSeconds    float64     `json:"age_seconds"`
	Reason        string      `json:"reason"`
	SessionEpoch  int64       `json:"session_epoch"`
	NodeID        *string     `json:"node_id"`
	NodeRun       *string     `json:"node_run"`
	FailedTasks   []uuid.UUID `json:"failed_tasks"`
	RequeuedTasks []uuid.UUID `json:"requeued_tasks"`
	Providers     int         `json:"providers"`
	OrphanJobs    []string    `json:"orphan_jobs"`
}

// SweepView is what a sweep did (or, as a dry run, would do): the answer of
// POST /v1/joblib/dashboard/sweep and the output of `joblib sweep --json`.
type SweepView struct {
	SweepID          uuid.UUID     `json:"sweep_id"`
	DryRun           bool          `json:"dry_run"`
	Threshold        string        `json:"threshold"`
	ThresholdSeconds float64       `json:"threshold_seconds"`
	Workers          []SweepWorker `json:"workers"`
	StuckInternal    []uuid.UUID   `json:"stuck_internal_tasks"`
	TasksFailed      int           `json:"tasks_failed"`
	TasksRequeued    int           `json:"tasks_requeued"`
	OrphanJobs       int           `json:"orphan_jobs"`
}

// NewSweepView describes a sweep report; owners names the workers' users.
func NewSweepView(rep joblib.SweepReport, owners map[uuid.UUID]string) SweepView {
	out := SweepView{SweepID: rep.SweepID, DryRun: rep.DryRun, Threshold: rep.Threshold.String(), ThresholdSeconds: rep.Threshold.Seconds(),
		Workers: []SweepWorker{}, StuckInternal: []uuid.UUID{}, TasksFailed: rep.Result.TasksFailed,
		TasksRequeued: rep.Result.TasksRequeued, OrphanJobs: rep.Result.OrphanJobs}
	for _, w := range rep.Result.Workers {
		age := w.DBNow.Sub(w.LastHeartbeat.Time)
		out.Workers = append(out.Workers, SweepWorker{
			ID: w.ID, UserID: w.UserID, UserName: owners[w.UserID], LastHeartbeat: w.LastHeartbeat.UTC(), DBNow: w.DBNow.UTC(), AgeSeconds: age.Seconds(),
			Reason:       fmt.Sprintf("no heartbeat for %s > threshold %s (database clock)", age.Round(time.Millisecond), rep.Threshold),
			SessionEpoch: w.SessionEpoch, NodeID: w.NodeID, NodeRun: w.NodeRun,
			FailedTasks: orEmpty(w.FailedTaskIDs), RequeuedTasks: orEmpty(w.RequeuedTaskIDs), Providers: w.ProvidersGone,
			OrphanJobs: orEmpty(w.OrphanJobs),
		})
	}
	for _, t := range rep.StuckInternal {
		out.StuckInternal = append(out.StuckInternal, t.ID)
	}
	return out
}

// SweepOwners returns the names of the owners of a sweep's workers.
func SweepOwners(ctx context.Context, svc *joblib.Service, rep joblib.SweepReport) (map[uuid.UUID]string, error) {
	ids := make([]uuid.UUID, len(rep.Result.Workers))
	for i, w := range rep.Result.Workers {
		ids[i] = w.UserID
	}
	return svc.UserNames(ctx, ids)
}

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// KeepAliveInterval is how often a node refreshes the heartbeats of its
// socket-bound workers: the configured interval, else a third of the worker
// timeout, at most 10 s.
func KeepAliveInterval(cfg RealtimeConfig, workerTimeout time.Duration) time.Duration {
	if cfg.KeepAliveInterval > 0 {
		return cfg.KeepAliveInterval
	}
	return min(10*time.Second, workerTimeout/3)
}

// SweepRequest is the body of POST /v1/joblib/dashboard/sweep.
type SweepRequest struct {
	// ThresholdSeconds: workers silent for longer are stale (default the
	// worker timeout). It must be at least twice the socket keep-alive.
	ThresholdSeconds *float64 `json:"threshold_seconds"`
}

// dashboardSweep runs an operator sweep (path operator) on this server.
func (s *Server) dashboardSweep(w http.ResponseWriter, r *http.Request) {
	p, ok := s.superuser(w, r)
	if !ok {
		return
	}
	var body SweepRequest
	if !s.decodeBody(w, r, &body) {
		return
	}
	threshold := s.svc.Settings().WorkerTimeout
	if body.ThresholdSeconds != nil {
		if *body.ThresholdSeconds <= 0 || *body.ThresholdSeconds > 1e9 {
			badRequest(w, "threshold_seconds must be a positive number of seconds, e.g. 90")
			return
		}
		threshold = time.Duration(*body.ThresholdSeconds * float64(time.Second))
	}
	if err := joblib.CheckSweepThreshold(threshold, time.Duration(s.keepAlive.Load())); err != nil {
		s.fail(w, r, err)
		return
	}
	rep, err := s.svc.Sweep(r.Context(), joblib.SweepParams{Path: joblib.PathOperator, Threshold: threshold})
	if err != nil {
		s.log.Warn("operator sweep failed", "actor", p.Name, "err", err)
		s.fail(w, r, err)
		return
	}
	owners, err := SweepOwners(r.Context(), s.svc, rep)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.log.Info("operator action", "action", "sweep", "actor", p.Name, "user_id", p.ID, "threshold", threshold,
		"workers", rep.Result.Cleaned, "sweep_id", rep.SweepID)
	s.pokeDashboard()
	s.answer(w, r, http.StatusOK, NewSweepView(rep, owners), nil)
}

// explainUnauthorized gives a bare authentication refusal its reason for
// the 401's detail: no credentials, a malformed Authorization header, or a
// token nobody issued (revoked, expired and inactive carry theirs).
func explainUnauthorized(r *http.Request, err error) error {
	var ae *joblib.AuthError
	if !errors.Is(err, joblib.ErrUnauthorized) || errors.As(err, &ae) {
		return err
	}
	switch h := r.Header.Get("Authorization"); {
	case tokenFrom(r) != "":
		return joblib.Unauthorized("Unknown token")
	case h != "":
		return joblib.Unauthorized("Malformed Authorization header: expected \"Bearer <token>\"")
	}
	return joblib.Unauthorized("No credentials: send the header \"Authorization: Bearer <token>\"")
}

// operatorActor names who acts in the audit log: the CLI's users act under
// their own name ("cli:alice"), everyone else through the dashboard.
func operatorActor(p joblib.Principal) string {
	if strings.HasPrefix(p.Name, joblib.OperatorUserPrefix) {
		return p.Name
	}
	return "dashboard:" + p.Name
}

// closeRemoved closes the sockets on this node that hold a worker another
// path removed (an operator's delete or sweep, the sweeper, a REST DELETE):
// the client learns at once that it lost its worker, reconnects, and its
// join answers 404, upon which it registers again. The disconnect path needs
// nothing: its socket is already closed. A worker removed by another node
// or process is found by the keep-alive, which closes its socket then.
func (rt *Realtime) closeRemoved(path string, res joblib.CleanupResult) {
	if path == joblib.PathDisconnect {
		return
	}
	ids := make([]uuid.UUID, len(res.Workers))
	for i, w := range res.Workers {
		ids[i] = w.ID
	}
	rt.dropWorkers(ids, path)
}

// dropWorkers unbinds the workers from their sockets on this node and
// closes those sockets.
func (rt *Realtime) dropWorkers(ids []uuid.UUID, why string) {
	socks := map[*sio.Socket][]uuid.UUID{}
	rt.mu.Lock()
	for _, id := range ids {
		if s := rt.bound[id]; s != nil {
			delete(rt.bound, id)
			socks[s] = append(socks[s], id)
		}
	}
	rt.mu.Unlock()
	for s, ids := range socks {
		// Not this socket's workers any more: its disconnect schedules no
		// cleanup for them.
		if st, _ := s.Data().(*connState); st != nil {
			st.mu.Lock()
			for _, id := range ids {
				delete(st.workers, id)
			}
			st.mu.Unlock()
		}
		rt.log.Info("closing the socket of a removed worker", "socket", s.ID(), "workers", ids, "removed_by", why)
		s.Disconnect()
	}
}
