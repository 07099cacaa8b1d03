package server

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/startstop"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/server/sio"
)

// Realtime is the Socket.IO side of the server: it authenticates
// connections, authorizes room joins, delivers committed events to room
// members, keeps socket-bound workers alive and sends a worker whose socket
// went away (and did not come back within the grace window) through
// CleanupWorker.
type Realtime struct {
	svc         *joblib.Service
	auth        *authenticator
	rooms       *roomAuth // nil without JOBLIB_ROOM_AUTH_URL
	publicReads bool
	cfg         RealtimeConfig
	// readDB and writeDB are REST's database time budgets
	// (JOBLIB_READ_DB_TIMEOUT, JOBLIB_WRITE_DB_TIMEOUT), which bound the
	// socket side's database work alike.
	readDB, writeDB time.Duration
	log             *slog.Logger
	io              *sio.Server
	// disconnects counts closed sockets by reason (a fixed set, see
	// sio.Reason*): "slow consumer" is the one operators alert on.
	disconnects *prometheus.CounterVec
	fwd         *forwarder
	dash        *dashHub

	mu     sync.Mutex
	bound  map[uuid.UUID]*sio.Socket // worker -> its socket on this node
	socks  map[*sio.Socket]struct{}  // connected sockets, re-checked on every credential tick
	graces map[uuid.UUID]*time.Timer // worker -> pending disconnect cleanup
	// started and closed: Start and Shutdown ran (each runs once).
	started, closed bool

	unsub   func()
	stop    chan struct{} // closed by Shutdown: the loops return
	stopped chan struct{} // closed once Shutdown has finished
	wg      sync.WaitGroup
	ctx     context.Context
	cancel  context.CancelFunc
}

// NewRealtime builds the Socket.IO endpoint; mount it with Server.Handle at
// "/socket.io/" and call Start (it follows the startstop contract).
func (s *Server) NewRealtime(cfg RealtimeConfig, log *slog.Logger) *Realtime {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.KeepAliveInterval <= 0 {
		cfg.KeepAliveInterval = KeepAliveInterval(cfg, s.svc.Settings().WorkerTimeout)
	}
	if len(cfg.AllowedOrigins) == 0 {
		cfg.AllowedOrigins = s.cfg.AllowedOrigins
	}
	ctx, cancel := context.WithCancel(context.Background())
	rt := &Realtime{
		svc: s.svc, auth: s.auth, rooms: s.rooms, publicReads: s.cfg.PublicReads, cfg: cfg, log: log,
		readDB: s.cfg.ReadDBTimeout, writeDB: s.cfg.WriteDBTimeout,
		bound: map[uuid.UUID]*sio.Socket{}, graces: map[uuid.UUID]*time.Timer{}, socks: map[*sio.Socket]struct{}{},
		stop: make(chan struct{}), stopped: make(chan struct{}), ctx: ctx, cancel: cancel,
		disconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "joblib_socket_disconnects_total",
			Help: "Closed Socket.IO connections on this node by reason (slow consumer, ping timeout, transport error, ...).",
		}, []string{"reason"}),
	}
	rt.io = sio.New(sio.Config{
		PingInterval:       cfg.PingInterval,
		PingTimeout:        cfg.PingTimeout,
		MaxPayload:         cfg.MaxMessageBytes,
		SendQueue:          cfg.SendQueue,
		OriginPatterns:     cfg.AllowedOrigins,
		ConnectTimeout:     cfg.ConnectTimeout,
		MaxAttachments:     cfg.MaxAttachments,
		MaxEventBytes:      cfg.MaxEventBytes,
		MaxDepth:           cfg.MaxEventDepth,
		MaxRooms:           cfg.MaxRooms,
		MaxSessions:        cfg.MaxSessions,
		MaxSessionsPerAddr: cfg.MaxSessionsPerAddr,
		MaxHints:           cfg.MaxHints,
		OnReject:           s.rejections.Inc,
		RejectAck:          rejectAck,
		Logger:             log,
		SessionID:          nodeSessionID(s.svc.Node().Run),
		Recovery: sio.RecoveryConfig{
			Window:       cfg.RecoveryWindow,
			MaxPackets:   cfg.RecoveryMaxPackets,
			MaxBytes:     cfg.RecoveryMaxBytes,
			HistoryBytes: cfg.RecoveryHistoryBytes,
			Store:        sessionStore(s.svc.DB(), s.svc.Bus()),
			Owner:        socketOwner,
			Wants:        wantsOffsets,
			// A recovered socket gets its UI rooms back; a worker's rooms
			// come with its binding, which only a join makes.
			KeepRoom: func(room string) bool { return strings.HasPrefix(room, events.Room("")) },
			// ... once the host has been asked again.
			Admit: rt.admitRooms,
		},
	}, rt)
	s.keepAlive.Store(int64(cfg.KeepAliveInterval))
	rt.dash = newDashHub(rt)
	rt.startDashboard(s)
	rt.fwd = newForwarder(s.svc, func(sid string) bool { return rt.io.Engine().Lookup(sid) != nil }, rt.io, log, s.rejections.Inc)
	return rt
}

// readBudget bounds a socket-side read (authentication, a credential
// re-check) as REST bounds a listing; writeBudget bounds a client event or
// a cleanup as REST bounds a mutating request. Past it the work is
// cancelled and answers as REST's statement-timeout (classify). A zero
// budget (disabled) leaves the work unbounded, as over REST.
func (rt *Realtime) readBudget(ctx context.Context) (context.Context, context.CancelFunc) {
	return dbBudgetContext(ctx, rt.readDB)
}

func (rt *Realtime) writeBudget(ctx context.Context) (context.Context, context.CancelFunc) {
	return dbBudgetContext(ctx, rt.writeDB)
}

// ServeHTTP serves /socket.io/. Requests for sessions of other nodes are
// forwarded to them.
func (rt *Realtime) ServeHTTP(w http.ResponseWriter, r *http.Request) { rt.fwd.ServeHTTP(w, r) }

// Forwarded is the number of socket requests forwarded to other nodes.
func (rt *Realtime) Forwarded() int64 { return rt.fwd.forwarded.Load() }

// NodeLookups is the number of node runs looked up in the database to
// forward socket requests.
func (rt *Realtime) NodeLookups() int64 { return rt.fwd.looked.Load() }

// IO exposes the Socket.IO server (room sizes, socket counts).
func (rt *Realtime) IO() *sio.Server { return rt.io }

// Start subscribes to the bus and starts the loops: keep-alive, dashboard,
// recovery purge and credential re-check. It returns at once; ctx is not
// kept (Stop or Shutdown ends the loops). Starting twice, or after a stop,
// does nothing.
func (rt *Realtime) Start(context.Context) error {
	rt.mu.Lock()
	again := rt.started || rt.closed
	rt.started = true
	rt.mu.Unlock()
	if again {
		return nil
	}
	rt.unsub = rt.svc.Bus().Subscribe(rt.deliver)
	rt.svc.OnCleanup(rt.closeRemoved)
	if m, ok := rt.svc.Bus().(events.Monitored); ok {
		m.Monitor().OnGap(func(events.Gap) {
			// What this node records to replay has a hole now: no
			// session may be recovered from an offset before it.
			rt.io.Namespace("/").ResetHistory()
			rt.invalidateAll("event bus gap")
		})
	}
	rt.wg.Go(rt.keepAlive)
	rt.wg.Go(rt.dash.loop)
	if rt.cfg.RecoveryWindow > 0 {
		rt.wg.Go(rt.purgeRecovery)
	}
	rt.wg.Go(rt.recheck)
	return nil
}

// Stop is Shutdown without a deadline of its own: every connection is
// closed with its handshake (a stuck write is bounded by the socket write
// timeout).
func (rt *Realtime) Stop() {
	if err := rt.Shutdown(context.Background()); err != nil {
		rt.log.Warn("close sockets", "err", err)
	}
}

// Shutdown closes every connection and stops the loops. Pending disconnect
// cleanups are dropped, not run: the workers of a node that is shutting down
// get their grace from reconnecting elsewhere, and startup recovery or the
// sweeper takes care of the rest. A second call waits for the first; ctx
// bounds the closing handshakes, past it connections are cut.
func (rt *Realtime) Shutdown(ctx context.Context) error {
	rt.mu.Lock()
	if rt.closed {
		rt.mu.Unlock()
		<-rt.stopped
		return nil
	}
	rt.closed = true
	for id, t := range rt.graces {
		t.Stop()
		delete(rt.graces, id)
	}
	rt.mu.Unlock()
	if rt.unsub != nil {
		rt.unsub()
	}
	close(rt.stop)
	err := rt.io.Shutdown(ctx)
	rt.cancel()
	rt.wg.Wait()
	close(rt.stopped)
	return err
}

// LeaseLost is what this node does when it finds its lease lapsed (it
// stalled longer than the lease, or another node judged it dead): it closes
// every worker socket, so that the workers re-join (re-registering if they
// were reaped) and get a fresh binding, and tells every UI room to refetch,
// with no recovery from an offset before now (the events of the stall are
// another node's to tell). Log and return the number of sockets closed.
func (rt *Realtime) LeaseLost() int {
	n := rt.DropWorkerSockets()
	rt.io.Namespace("/").ResetHistory()
	rt.invalidateAll("node lease lost")
	rt.log.Warn("node lease lost: worker sockets closed", "worker_sockets", n)
	return n
}

// Realtime follows the one start/stop contract (serve starts and stops it
// as one of its parts).
var _ startstop.Service = (*Realtime)(nil)
