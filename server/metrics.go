package server

import (
	"context"
	"crypto/subtle"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// Metrics are joblib's Prometheus metrics. All label values are bounded
// (cleanup paths, sweep outcomes, task statuses).
type Metrics struct {
	// WorkersCleaned counts removed workers by cleanup path.
	WorkersCleaned *prometheus.CounterVec
	// DetectionLatency observes, per cleaned worker, the database time of the
	// cleanup minus its last heartbeat, by path.
	DetectionLatency *prometheus.HistogramVec
	// FalsePositives counts reaped workers heard from again, by the path
	// that reaped them.
	FalsePositives *prometheus.CounterVec
	// Sweeps counts sweeper intervals by outcome.
	Sweeps *prometheus.CounterVec
	// SweepDuration observes the duration of sweeps that ran.
	SweepDuration prometheus.Histogram
	// SweeperLeader is 1 while this node is the sweeper.
	SweeperLeader prometheus.Gauge
	// TasksDeleted counts finished tasks deleted by retention, by status.
	TasksDeleted *prometheus.CounterVec
	// BusGaps counts detected losses of other nodes' events, by reason
	// (sequence, reconnect).
	BusGaps *prometheus.CounterVec
	// BusLag observes the delivery lag of batches received from other
	// nodes (publisher's clock to receipt).
	BusLag prometheus.Histogram
}

// NewMetrics creates the metrics, registers them (and a collector that
// counts live workers and tasks by status from the database at scrape time)
// with reg, and observes svc's cleanups and false positives.
func NewMetrics(reg prometheus.Registerer, svc *joblib.Service) (*Metrics, error) {
	m := &Metrics{
		WorkersCleaned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "joblib_workers_cleaned_total", Help: "Workers removed by a cleanup, by path (graceful, disconnect, sweeper, startup, operator).",
		}, []string{"path"}),
		DetectionLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "joblib_worker_detection_latency_seconds",
			Help: "Database time of a worker's cleanup minus its last heartbeat, by path.",
			// Fine around the defaults' detection times (a 5 s grace, a 60 s
			// timeout plus a 30 s sweep), so quantiles read from it are close.
			Buckets: []float64{0.1, 0.25, 0.5, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45, 60, 70, 80, 90, 105, 120, 180, 300, 600, 3600},
		}, []string{"path"}),
		FalsePositives: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "joblib_false_positives_total", Help: "Reaped workers heard from again (late heartbeat or status update), by the path that reaped them.",
		}, []string{"path"}),
		Sweeps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "joblib_sweeps_total", Help: "Sweeper intervals by outcome (acted, idle, held, capped, follower, error).",
		}, []string{"outcome"}),
		SweepDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "joblib_sweep_duration_seconds", Help: "Duration of sweeps that ran.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}),
		SweeperLeader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "joblib_sweeper_leader", Help: "1 while this node is the sweeper.",
		}),
		TasksDeleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "joblib_tasks_deleted_total", Help: "Finished tasks deleted by retention, by status (completed, cancelled, failed).",
		}, []string{"status"}),
		BusGaps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "joblib_bus_gaps_total", Help: "Detected losses of other nodes' events, by reason (sequence, reconnect); UI rooms are told to refetch.",
		}, []string{"reason"}),
		BusLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "joblib_bus_lag_seconds", Help: "Delivery lag of event batches received from other nodes (publisher's clock to receipt).",
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5},
		}),
	}
	for _, st := range []string{models.StatusCompleted, models.StatusCancelled, models.StatusFailed} {
		m.TasksDeleted.WithLabelValues(st)
	}
	for _, r := range events.GapReasons {
		m.BusGaps.WithLabelValues(r)
	}
	if mon, ok := svc.Bus().(events.Monitored); ok {
		mon.Monitor().OnGap(func(g events.Gap) { m.BusGaps.WithLabelValues(g.Reason).Inc() })
		mon.Monitor().OnLag(func(d time.Duration) { m.BusLag.Observe(max(d, 0).Seconds()) })
	}
	for _, p := range joblib.Paths {
		m.WorkersCleaned.WithLabelValues(p)
		m.FalsePositives.WithLabelValues(p)
	}
	for _, o := range joblib.SweepOutcomes {
		m.Sweeps.WithLabelValues(o)
	}
	for _, c := range []prometheus.Collector{m.WorkersCleaned, m.DetectionLatency, m.FalsePositives, m.Sweeps,
		m.SweepDuration, m.SweeperLeader, m.TasksDeleted, m.BusGaps, m.BusLag, newStateCollector(svc.DB())} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	svc.OnCleanup(func(path string, r joblib.CleanupResult) {
		m.WorkersCleaned.WithLabelValues(path).Add(float64(r.Cleaned))
		h := m.DetectionLatency.WithLabelValues(path)
		for _, w := range r.Workers {
			h.Observe(max(w.DBNow.Sub(w.LastHeartbeat.Time), 0).Seconds())
		}
	})
	svc.OnFalsePositive(func(fp joblib.FalsePositive) {
		m.FalsePositives.WithLabelValues(fp.Path).Inc()
	})
	svc.OnTasksPruned(func(status string, n int64) {
		m.TasksDeleted.WithLabelValues(status).Add(float64(n))
	})
	return m, nil
}

// ObserveSweeper counts a sweeper's intervals and tracks its leadership.
func (m *Metrics) ObserveSweeper(sw *joblib.Sweeper) {
	sw.OnSweep(func(e joblib.SweepEvent) {
		m.Sweeps.WithLabelValues(e.Outcome).Inc()
		switch e.Outcome {
		case joblib.SweepActed, joblib.SweepIdle, joblib.SweepCapped:
			m.SweepDuration.Observe(e.Report.Took.Seconds())
		}
		if sw.Leading() {
			m.SweeperLeader.Set(1)
		} else {
			m.SweeperLeader.Set(0)
		}
	})
}

// MetricsHandler serves g in the Prometheus exposition format; mount it
// with Server.Handle("GET /metrics", ...).
func MetricsHandler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{})
}

// RequireBearer guards h with a fixed bearer token (JOBLIB_METRICS_TOKEN):
// requests without `Authorization: Bearer <token>` answer 401 problem+json.
// An empty token returns h unguarded.
func RequireBearer(token string, h http.Handler) http.Handler {
	if token == "" {
		return h
	}
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="joblib-metrics"`)
			writeProblem(w, newProblem(joblib.CodeUnauthorized, "Unauthorized"))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// stateCollector reads live workers, and tasks by status from the counts
// the database keeps incrementally, at scrape time: a scrape's cost does not
// grow with the tasks table.
type stateCollector struct {
	db      *models.DB
	workers *prometheus.Desc
	tasks   *prometheus.Desc
	nodes   *prometheus.Desc
}

func newStateCollector(db *models.DB) *stateCollector {
	return &stateCollector{
		db:      db,
		workers: prometheus.NewDesc("joblib_workers", "Registered (live) workers.", nil, nil),
		tasks:   prometheus.NewDesc("joblib_tasks", "Tasks by status.", []string{"status"}, nil),
		nodes:   prometheus.NewDesc("joblib_nodes", "Node leases by state: live, or lapsed and not yet released.", []string{"state"}, nil),
	}
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.workers
	ch <- c.tasks
	ch <- c.nodes
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	q := c.db.Q(ctx)
	_, total, err := q.CountWorkers(time.Hour)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.workers, err)
	} else {
		ch <- prometheus.MustNewConstMetric(c.workers, prometheus.GaugeValue, float64(total))
	}
	if nodes, err := q.ListNodes(); err != nil {
		ch <- prometheus.NewInvalidMetric(c.nodes, err)
	} else {
		var live float64
		for _, n := range nodes {
			if n.Live {
				live++
			}
		}
		ch <- prometheus.MustNewConstMetric(c.nodes, prometheus.GaugeValue, live, "live")
		ch <- prometheus.MustNewConstMetric(c.nodes, prometheus.GaugeValue, float64(len(nodes))-live, "lapsed")
	}
	counts, err := q.CountTasksByStatus()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.tasks, err)
		return
	}
	for _, st := range []string{models.StatusPending, models.StatusClaimed, models.StatusRunning,
		models.StatusCompleted, models.StatusFailed, models.StatusCancelled} {
		ch <- prometheus.MustNewConstMetric(c.tasks, prometheus.GaugeValue, float64(counts[st]), st)
	}
}

// SocketCollector reports the open Socket.IO connections of rt, read at
// scrape time, and its closed connections by reason.
func SocketCollector(rt *Realtime) prometheus.Collector {
	return socketCollector{
		open: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "joblib_socket_connections", Help: "Open Socket.IO connections on this node.",
		}, func() float64 { return float64(rt.io.NumSockets()) }),
		disconnects: rt.disconnects,
	}
}

type socketCollector struct {
	open        prometheus.GaugeFunc
	disconnects *prometheus.CounterVec
}

func (c socketCollector) Describe(ch chan<- *prometheus.Desc) {
	c.open.Describe(ch)
	c.disconnects.Describe(ch)
}

func (c socketCollector) Collect(ch chan<- prometheus.Metric) {
	c.open.Collect(ch)
	c.disconnects.Collect(ch)
}

// HomeCollectors count the claims and status reports this node routed to
// their user's home node, and those of them it served itself because the
// home node could not be reached.
func HomeCollectors(s *Server) []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "joblib_home_forwarded_total", Help: "Claims and status reports routed to the user's home node (JOBLIB_HOME_ROUTING), fallbacks included.",
		}, func() float64 { return float64(s.HomeForwarded()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "joblib_home_fallbacks_total", Help: "Claims and status reports routed to the user's home node but served here because it could not be reached.",
		}, func() float64 { return float64(s.HomeFallbacks()) }),
	}
}

// ForwardCollector counts the socket requests (polling, upgrades) this node
// forwarded to the node that holds their session.
func ForwardCollector(rt *Realtime) prometheus.Collector {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "joblib_socket_forwarded_total", Help: "Socket.IO requests forwarded to the node holding their session (load balancers without stickiness).",
	}, func() float64 { return float64(rt.Forwarded()) })
}
