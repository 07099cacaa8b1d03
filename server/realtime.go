package server

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/clientaddr"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server/sio"
)

// RealtimeConfig configures the Socket.IO endpoint (JOBLIB_-prefixed
// environment variables; see the tags).
type RealtimeConfig struct {
	// PingInterval is how often the server pings each connection.
	PingInterval time.Duration `env:"PING_INTERVAL" envDefault:"25s"`
	// PingTimeout is how long a ping may go unanswered before the
	// connection is considered dead.
	PingTimeout time.Duration `env:"PING_TIMEOUT" envDefault:"20s"`
	// DisconnectGrace is how long a worker whose socket closed keeps its
	// claims; re-joining with the same worker id within it keeps the worker.
	DisconnectGrace time.Duration `env:"DISCONNECT_GRACE" envDefault:"5s"`
	// KeepAliveInterval is how often the heartbeats of workers with an open
	// socket on this node are refreshed (one statement for all of them).
	// 0 means a third of the worker timeout, at most 10 s.
	KeepAliveInterval time.Duration `env:"SOCKET_KEEPALIVE_INTERVAL" envDefault:"0s"`
	// AllowedOrigins are the browser origins (host patterns such as
	// "app.example.com" or "*.example.com") allowed to connect; requests
	// without an Origin header (workers) are always allowed. Empty: the
	// server's Config.AllowedOrigins (the same variable).
	AllowedOrigins []string `env:"ALLOWED_ORIGINS"`
	// MaxMessageBytes caps one Socket.IO message or polling body.
	MaxMessageBytes int64 `env:"SOCKET_MAX_MESSAGE_BYTES" envDefault:"1000000"`
	// SendQueue is each connection's outbound queue in packets; a connection
	// that lets it fill is closed as a slow consumer.
	SendQueue int `env:"SOCKET_SEND_QUEUE" envDefault:"1024"`
	// ConnectTimeout closes a session that has not joined a namespace
	// (Socket.IO CONNECT) within it.
	ConnectTimeout time.Duration `env:"SOCKET_CONNECT_TIMEOUT" envDefault:"20s"`
	// MaxAttachments bounds the binary attachments of one event.
	MaxAttachments int `env:"SOCKET_MAX_ATTACHMENTS" envDefault:"64"`
	// MaxEventBytes bounds one event with its attachments, counted as they
	// arrive.
	MaxEventBytes int64 `env:"SOCKET_MAX_EVENT_BYTES" envDefault:"10000000"`
	// MaxEventDepth bounds the nesting of an event's arguments.
	MaxEventDepth int `env:"SOCKET_MAX_JSON_DEPTH" envDefault:"64"`
	// MaxRooms bounds the rooms one socket is in.
	MaxRooms int `env:"SOCKET_MAX_ROOMS" envDefault:"1000"`
	// MaxSessions and MaxSessionsPerAddr bound the open Engine.IO sessions
	// of this node, in total and per client IP address.
	MaxSessions        int `env:"SOCKET_MAX_SESSIONS" envDefault:"100000"`
	MaxSessionsPerAddr int `env:"SOCKET_MAX_SESSIONS_PER_ADDR" envDefault:"1000"`
	// MaxHints bounds the task_available / provider_request notices waiting
	// for one connection; more are dropped (the worker claims, the reader
	// retries), never disconnecting it.
	MaxHints int `env:"SOCKET_MAX_HINTS" envDefault:"32"`
	// RecoveryWindow is how long a UI that lost its connection may recover
	// it (socket.io-client ≥ 4.6 connection state recovery): same socket
	// id and rooms, and the room events it missed replayed in order. 0
	// disables recovery.
	RecoveryWindow time.Duration `env:"SOCKET_RECOVERY_WINDOW" envDefault:"2m"`
	// RecoveryMaxPackets and RecoveryMaxBytes bound what one socket may
	// have replayed; a UI that missed more gets a fresh session (and
	// refetches). RecoveryMaxPackets stays below SendQueue.
	RecoveryMaxPackets int   `env:"SOCKET_RECOVERY_MAX_PACKETS" envDefault:"1000"`
	RecoveryMaxBytes   int64 `env:"SOCKET_RECOVERY_MAX_BYTES" envDefault:"4194304"`
	// RecoveryHistoryBytes bounds the room events this node keeps to
	// replay (oldest dropped first).
	RecoveryHistoryBytes int64 `env:"SOCKET_RECOVERY_HISTORY_BYTES" envDefault:"67108864"`
}

// DefaultRealtimeConfig returns the documented defaults.
func DefaultRealtimeConfig() RealtimeConfig {
	return RealtimeConfig{
		PingInterval: 25 * time.Second, PingTimeout: 20 * time.Second, DisconnectGrace: 5 * time.Second,
		MaxMessageBytes: 1_000_000, SendQueue: 1024, ConnectTimeout: 20 * time.Second,
		MaxAttachments: 64, MaxEventBytes: 10_000_000, MaxEventDepth: 64, MaxRooms: 1000,
		MaxSessions: 100_000, MaxSessionsPerAddr: 1000, MaxHints: 32,
		RecoveryWindow: 2 * time.Minute, RecoveryMaxPackets: 1000, RecoveryMaxBytes: 4 << 20, RecoveryHistoryBytes: 64 << 20,
	}
}

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
	log         *slog.Logger
	io          *sio.Server
	// disconnects counts closed sockets by reason (a fixed set, see
	// sio.Reason*): "slow consumer" is the one operators alert on.
	disconnects *prometheus.CounterVec
	fwd         *forwarder
	dash        *dashHub

	mu     sync.Mutex
	bound  map[uuid.UUID]*sio.Socket // worker -> its socket on this node
	socks  map[*sio.Socket]struct{}  // connected sockets, re-checked on every credential tick
	graces map[uuid.UUID]*time.Timer // worker -> pending disconnect cleanup
	closed bool

	unsub  func()
	stop   chan struct{}
	wg     sync.WaitGroup
	ctx    context.Context
	cancel context.CancelFunc
}

// connState is what a socket carries: who it is, and the workers it bound.
type connState struct {
	p       joblib.Principal
	token   string // the credential, forwarded to the room authorization host
	anon    bool   // connected without credentials under PublicReads: rooms only
	mu      sync.Mutex
	workers map[uuid.UUID]int64 // worker -> session epoch of this binding
	// gates are the socket's rooms that the room authorization host
	// granted, by Socket.IO room: each is asked again on every tick.
	gates map[string]roomGate
}

// roomGate is what the host was asked for a socket's room, and how the
// room_left event names the room.
type roomGate struct {
	room   string // the host's room
	access string
	// job or provider: the full name a worker joined the room of.
	job, provider string
}

// gate records a room granted by the host (nothing without room auth).
func (st *connState) gate(sioRoom string, g roomGate) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.gates == nil {
		st.gates = map[string]roomGate{}
	}
	st.gates[sioRoom] = g
}

// gateJoined records g for a join that succeeded after the host was asked.
func (st *connState) gateJoined(res ack, sioRoom string, g roomGate) {
	if res.OK && g.room != "" {
		st.gate(sioRoom, g)
	}
}

func (st *connState) ungate(sioRoom string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	delete(st.gates, sioRoom)
}

// NewRealtime builds the Socket.IO endpoint; mount it with Server.Handle at
// "/socket.io/" and call Start.
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
		bound: map[uuid.UUID]*sio.Socket{}, graces: map[uuid.UUID]*time.Timer{}, socks: map[*sio.Socket]struct{}{},
		stop: make(chan struct{}), ctx: ctx, cancel: cancel,
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

// Start subscribes to the bus and starts the keep-alive loop.
func (rt *Realtime) Start() {
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
}

// Shutdown closes every connection and stops the loops. Pending disconnect
// cleanups are dropped, not run: the workers of a node that is shutting down
// get their grace from reconnecting elsewhere, and startup recovery or the
// sweeper takes care of the rest.
func (rt *Realtime) Shutdown(ctx context.Context) error {
	rt.mu.Lock()
	if rt.closed {
		rt.mu.Unlock()
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

// DropWorkerSockets closes every socket that holds a worker on this node, so
// that those workers reconnect and join again. Used when this node's lease
// was taken away: another node has released (cleaned) its workers.
func (rt *Realtime) DropWorkerSockets() int {
	rt.mu.Lock()
	socks := make(map[*sio.Socket]bool, len(rt.bound))
	for _, s := range rt.bound {
		socks[s] = true
	}
	rt.mu.Unlock()
	for s := range socks {
		s.Disconnect()
	}
	return len(socks)
}

// deliver sends a committed emission to its room. It never blocks: the
// Socket.IO server enqueues on each member's bounded queue. task_available
// and provider_request are hints (the worker claims, the reader retries):
// for a connection that is behind they are dropped rather than queued, so a
// flood of them never disconnects a worker or a provider. The events of UI
// rooms ("room:...") carry their bus offset as a trailing argument and are
// recorded for connection state recovery; the workers' rooms get no offset
// (their clients do not recover: they rejoin and claim).
func (rt *Realtime) deliver(e events.Emission) {
	rt.dash.poke()
	if ev, ok := e.Event.(events.TaskStatusEvent); ok {
		rt.svc.Trends().TaskFinished(ev.Status)
	}
	var err error
	switch e.Event.(type) {
	case events.TaskAvailable, events.ProviderRequest:
		err = rt.io.EmitHintTo(e.Room, e.Event.EventName(), e.Payload())
	default:
		if e.Offset != "" && strings.HasPrefix(e.Room, events.Room("")) {
			err = rt.io.EmitToAt(e.Room, e.Offset, e.Event.EventName(), e.Payload())
		} else {
			err = rt.io.EmitTo(e.Room, e.Event.EventName(), e.Payload())
		}
	}
	if err != nil {
		rt.log.Error("deliver event", "event", e.Event.EventName(), "room", e.Room, "err", err)
	}
}

// rejectAck answers an event that asked for an ack and exceeded a socket
// budget.
func rejectAck(limit string) []any {
	detail := map[string]string{
		sio.LimitAttachments: "too many binary attachments",
		sio.LimitEventBytes:  "event too large",
		sio.LimitDepth:       "arguments nested too deeply",
	}[limit]
	status := 413
	if limit == sio.LimitDepth {
		status = 422
	}
	return []any{ack{Status: status, Detail: detail}}
}

// invalidateAll tells every UI room on this node to refetch: events of
// other nodes were lost (a bus gap) or this node stalled, so its job,
// provider and task views may be stale.
func (rt *Realtime) invalidateAll(why string) {
	rt.mu.Lock()
	closed := rt.closed
	rt.mu.Unlock()
	if closed {
		return
	}
	n := 0
	for _, room := range rt.io.Rooms() {
		if !strings.HasPrefix(room, "room:") {
			continue
		}
		for _, ev := range []events.Event{events.JobsInvalidate{}, events.ProvidersInvalidate{}, events.TasksInvalidate{}} {
			rt.deliver(events.Emission{Room: room, Event: ev})
		}
		n++
	}
	rt.log.Warn(why+": UI rooms told to refetch", "rooms", n)
}

// connectError is a CONNECT refusal.
type connectError struct{ msg string }

func (e connectError) Error() string { return e.msg }

// OnConnect authenticates a connection from its CONNECT auth payload
// (`{"token": ...}`), or the handshake's Authorization header or cookie.
// Under PublicReads a connection without credentials is let in to follow
// rooms, but it cannot act for a worker.
func (rt *Realtime) OnConnect(ctx context.Context, s *sio.Socket, req *http.Request, auth json.RawMessage) error {
	token := tokenFromAuth(auth)
	if token == "" {
		token = tokenFrom(req)
	}
	if token == "" && rt.publicReads {
		s.SetData(&connState{anon: true, workers: map[uuid.UUID]int64{}})
		rt.mu.Lock()
		rt.socks[s] = struct{}{}
		rt.mu.Unlock()
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 800*time.Millisecond)
	defer cancel()
	p, err := rt.auth.authenticate(clientaddr.NewContext(ctx, s.RemoteAddr()), token)
	if err != nil {
		if errors.Is(err, joblib.ErrUnauthorized) {
			return connectError{"Unauthorized"}
		}
		if e, ok := joblib.AsError(err); ok && e.Code == joblib.CodeRateLimited {
			return connectError{"Too many refused credentials from this address"}
		}
		rt.log.Error("authenticate socket", "err", err)
		return connectError{"Authentication unavailable"}
	}
	s.SetData(&connState{p: p, token: token, workers: map[uuid.UUID]int64{}})
	rt.mu.Lock()
	rt.socks[s] = struct{}{}
	rt.mu.Unlock()
	return nil
}

func tokenFromAuth(raw json.RawMessage) string {
	var a map[string]any
	if len(raw) == 0 || json.Unmarshal(raw, &a) != nil {
		return ""
	}
	for _, k := range []string{"token", "access_token", "Authorization", "authorization"} {
		if v, ok := a[k].(string); ok && v != "" {
			if scheme, tok, ok := strings.Cut(v, " "); ok && strings.EqualFold(scheme, "Bearer") {
				return tok
			}
			return v
		}
	}
	return ""
}

// ack is the answer to a client event that asked for one.
type ack struct {
	OK     bool   `json:"ok"`
	Status int    `json:"status,omitempty"`
	Detail string `json:"detail,omitempty"`
	// Tasks answers claim_tasks (an empty list when nothing was claimable).
	Tasks *[]joblib.Task `json:"tasks,omitempty"`
	// Results answers update_tasks, one item per report.
	Results []taskUpdateItem `json:"results,omitempty"`
	// Dashboard answers join_dashboard.
	Dashboard *DashboardView `json:"dashboard,omitempty"`
}

// OnEvent handles the client→server events of contract §5.3 plus the UI's
// join_room/leave_room and the workers' claim_tasks.
func (rt *Realtime) OnEvent(ctx context.Context, s *sio.Socket, ev sio.Event, reply sio.AckFunc) {
	st, _ := s.Data().(*connState)
	if st == nil {
		return
	}
	res := rt.handle(ctx, s, st, ev)
	if reply != nil {
		if err := reply(res); err != nil {
			rt.log.Debug("ack", "event", ev.Name, "err", err)
		}
	} else if !res.OK {
		rt.log.Debug("client event refused", "event", ev.Name, "status", res.Status, "detail", res.Detail)
	}
}

func (rt *Realtime) handle(ctx context.Context, s *sio.Socket, st *connState, ev sio.Event) ack {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// After a stall this node acts for nobody until its lease is known
	// valid again; if it lapsed, this socket is being dropped.
	if err := rt.svc.AwaitNodeLease(ctx); err != nil {
		return ack{Status: 503, Detail: "This node is checking its lease after a stall; reconnect and retry"}
	}
	var body struct {
		JobName      *string `json:"job_name"`
		ProviderName *string `json:"provider_name"`
		WorkerID     *string `json:"worker_id"`
		RoomID       *string `json:"room_id"`
		Limit        *int    `json:"limit"`
		Start        bool    `json:"start"`
		// Updates are update_tasks' reports.
		Updates json.RawMessage `json:"updates"`
	}
	if len(ev.Args) > 0 {
		if err := json.Unmarshal(ev.Args[0], &body); err != nil {
			return ack{Status: 422, Detail: "the event's argument must be a JSON object"}
		}
	}
	switch ev.Name {
	case "join_job_room", "leave_job_room":
		if body.JobName == nil || body.WorkerID == nil {
			return ack{Status: 422, Detail: "job_name and worker_id are required"}
		}
		room := events.JobRoom(*body.JobName)
		if ev.Name == "leave_job_room" {
			s.Leave(room)
			st.ungate(room)
			return ack{OK: true}
		}
		var g roomGate
		res := rt.joinAsWorker(ctx, s, st, *body.WorkerID, room, func() (err error) {
			if g, err = rt.roomAccess(ctx, s, st, roomGate{job: *body.JobName}); err != nil {
				return err
			}
			return rt.svc.CheckJob(ctx, *body.JobName)
		})
		st.gateJoined(res, room, g)
		return res
	case "join_provider_room", "leave_provider_room":
		if body.ProviderName == nil || body.WorkerID == nil {
			return ack{Status: 422, Detail: "provider_name and worker_id are required"}
		}
		room := events.ProviderRoom(*body.ProviderName)
		if ev.Name == "leave_provider_room" {
			s.Leave(room)
			st.ungate(room)
			return ack{OK: true}
		}
		var g roomGate
		res := rt.joinAsWorker(ctx, s, st, *body.WorkerID, room, func() (err error) {
			if g, err = rt.roomAccess(ctx, s, st, roomGate{provider: *body.ProviderName}); err != nil {
				return err
			}
			return rt.svc.CheckProvider(ctx, st.p, *body.ProviderName)
		})
		st.gateJoined(res, room, g)
		return res
	case "join_dashboard":
		return rt.joinDashboard(ctx, s, st)
	case "leave_dashboard":
		s.Leave(dashboardRoom)
		return ack{OK: true}
	case "claim_tasks":
		return rt.claimTasks(ctx, st, body.WorkerID, body.Limit, body.Start)
	case "update_tasks":
		return rt.updateTasks(ctx, st, body.Updates)
	case "task_progress":
		return rt.taskProgress(ctx, st, ev.Args)
	case "join_room", "leave_room":
		if body.RoomID == nil {
			return ack{Status: 422, Detail: "room_id is required"}
		}
		if err := joblib.ValidateRoomID(*body.RoomID); err != nil {
			return errAck(err)
		}
		room := events.Room(*body.RoomID)
		if ev.Name == "leave_room" {
			s.Leave(room)
			st.ungate(room)
			return ack{OK: true}
		}
		if rt.rooms != nil {
			if err := rt.rooms.check(clientaddr.NewContext(ctx, s.RemoteAddr()), st.p, st.token, *body.RoomID, accessRead); err != nil {
				return errAck(err)
			}
		}
		if err := s.Join(room); err != nil {
			return joinErrAck(err)
		}
		if rt.rooms != nil {
			st.gate(room, roomGate{room: *body.RoomID, access: accessRead})
		}
		return ack{OK: true}
	}
	return ack{Status: 404, Detail: fmt.Sprintf("unknown event %q", ev.Name)}
}

// claimTasks is the socket batch claim (beyond the contract): a worker with
// a socket claims without any HTTP request; the ack carries the tasks.
func (rt *Realtime) claimTasks(ctx context.Context, st *connState, rawWorker *string, rawLimit *int, start bool) ack {
	if st.anon {
		return ack{Status: 401, Detail: "Unauthorized"}
	}
	if rawWorker == nil {
		return ack{Status: 422, Detail: "worker_id is required"}
	}
	wid, err := uuid.Parse(*rawWorker)
	if err != nil {
		return ack{Status: 422, Detail: "worker_id must be a UUID"}
	}
	limit := 1
	if rawLimit != nil {
		limit = *rawLimit
	}
	ts, err := rt.svc.ClaimTasks(ctx, st.p, wid, limit, start)
	if err != nil {
		return errAck(err)
	}
	if ts == nil {
		ts = []joblib.Task{}
	}
	return ack{OK: true, Tasks: &ts}
}

// updateTasks is the socket batch update (beyond the contract): a worker
// with a socket reports the status of many tasks without any HTTP request;
// the ack carries one item per report, as POST /tasks/update-batch answers.
func (rt *Realtime) updateTasks(ctx context.Context, st *connState, raw json.RawMessage) ack {
	if st.anon {
		return ack{Status: 401, Detail: "Unauthorized"}
	}
	ups, err := decodeTaskUpdates(raw)
	if err != nil {
		return ack{Status: 422, Detail: err.Error()}
	}
	rs, err := rt.svc.UpdateTasks(ctx, st.p, ups)
	if err != nil {
		if _, ok := joblib.AsError(err); !ok {
			rt.log.Error("update_tasks failed", "err", err)
		}
		return errAck(err)
	}
	return ack{OK: true, Results: taskUpdateItems(ctx, rt.log, rs)}
}

// taskProgress is a worker's progress report over its socket
// (task_progress {task_id, current, total, message}), answered as PATCH
// /tasks/{id} with {"progress": ...} would be.
func (rt *Realtime) taskProgress(ctx context.Context, st *connState, args []json.RawMessage) ack {
	if st.anon {
		return ack{Status: 401, Detail: "Unauthorized"}
	}
	var b struct {
		TaskID *string `json:"task_id"`
		joblib.Progress
	}
	if len(args) == 0 || json.Unmarshal(args[0], &b) != nil || b.TaskID == nil {
		return ack{Status: 422, Detail: "task_id is required; current and total are numbers, message a string"}
	}
	id, err := uuid.Parse(*b.TaskID)
	if err != nil {
		return ack{Status: 422, Detail: "task_id must be a UUID"}
	}
	if _, err := rt.svc.ReportProgress(ctx, st.p, id, b.Progress); err != nil {
		return errAck(err)
	}
	return ack{OK: true}
}

// joinAsWorker authorizes a worker's join (the worker is the caller's, the
// target exists), joins the room and binds the worker to this socket.
func (rt *Realtime) joinAsWorker(ctx context.Context, s *sio.Socket, st *connState, rawWorker, room string, exists func() error) ack {
	if st.anon {
		return ack{Status: 401, Detail: "Unauthorized"}
	}
	wid, err := uuid.Parse(rawWorker)
	if err != nil {
		return ack{Status: 422, Detail: "worker_id must be a UUID"}
	}
	if err := rt.svc.CheckWorker(ctx, st.p, wid); err != nil {
		return errAck(err)
	}
	if err := exists(); err != nil {
		return errAck(err)
	}
	st.mu.Lock()
	_, already := st.workers[wid]
	st.mu.Unlock()
	if !already {
		// Ownership was checked above; a worker deleted since is not found.
		epoch, err := rt.svc.BindWorker(ctx, wid)
		if err != nil {
			return errAck(err)
		}
		st.mu.Lock()
		st.workers[wid] = epoch
		st.mu.Unlock()
		rt.mu.Lock()
		if t := rt.graces[wid]; t != nil {
			t.Stop()
			delete(rt.graces, wid)
		}
		rt.bound[wid] = s
		rt.mu.Unlock()
		rt.dash.poke()
		// The worker's own room: task_cancelled for the tasks it holds
		// reaches this socket from any node.
		if err := s.Join(events.WorkerRoom(wid.String())); err != nil {
			return joinErrAck(err)
		}
	}
	if err := s.Join(room); err != nil {
		return joinErrAck(err)
	}
	return ack{OK: true}
}

// joinErrAck answers a join past the rooms-per-socket budget.
func joinErrAck(err error) ack {
	return ack{Status: 429, Detail: err.Error()}
}

// roomAccess asks the room authorization host (when configured) whether the
// socket's caller may read the room of the job or provider (g) it joins as a
// worker: the room the object belongs to. It returns g completed with what
// was asked (g.room is empty when nothing was).
func (rt *Realtime) roomAccess(ctx context.Context, s *sio.Socket, st *connState, g roomGate) (roomGate, error) {
	if rt.rooms == nil {
		return g, nil
	}
	room, ok := objectRoom(g.job + g.provider)
	if !ok || specialRoom(room) {
		return g, nil // not found by the existence check that follows, or joblib's own
	}
	if err := rt.rooms.check(clientaddr.NewContext(ctx, s.RemoteAddr()), st.p, st.token, room, accessRead); err != nil {
		return g, err
	}
	g.room, g.access = room, accessRead
	return g, nil
}

func errAck(err error) ack {
	if e, ok := joblib.AsError(err); ok {
		return ack{Status: newProblem(e.Code, e.Detail).Status, Detail: e.Detail}
	}
	if errors.Is(err, errRoomAuthUnavailable) {
		return ack{Status: 503, Detail: "Room authorization service unavailable"}
	}
	return ack{Status: 500, Detail: "internal error"}
}

// OnDisconnect schedules the disconnect cleanup of the socket's workers after
// the grace window. It is fenced by the session epoch of this socket's
// binding: a re-join (here or on another node) moves the epoch on and the
// cleanup then finds nothing to do.
func (rt *Realtime) OnDisconnect(s *sio.Socket, reason string) {
	rt.disconnects.WithLabelValues(reason).Inc()
	rt.dash.disconnected(reason)
	rt.mu.Lock()
	delete(rt.socks, s)
	rt.mu.Unlock()
	st, _ := s.Data().(*connState)
	if st == nil {
		return
	}
	st.mu.Lock()
	workers := st.workers
	st.workers = map[uuid.UUID]int64{}
	st.mu.Unlock()
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for wid, epoch := range workers {
		if rt.bound[wid] == s {
			delete(rt.bound, wid)
		}
		if rt.closed {
			continue
		}
		rt.log.Info("worker socket closed", "worker", wid, "reason", reason, "grace", rt.cfg.DisconnectGrace)
		if old := rt.graces[wid]; old != nil {
			old.Stop()
		}
		rt.graces[wid] = time.AfterFunc(rt.cfg.DisconnectGrace, func() { rt.expire(wid, epoch) })
	}
}

// expire runs the disconnect cleanup of one worker once its grace is over.
func (rt *Realtime) expire(wid uuid.UUID, epoch int64) {
	rt.mu.Lock()
	delete(rt.graces, wid)
	closed := rt.closed
	rt.mu.Unlock()
	if closed {
		return
	}
	rt.wg.Add(1)
	defer rt.wg.Done()
	ctx, cancel := context.WithTimeout(rt.ctx, 30*time.Second)
	defer cancel()
	// A timer that fires as the node wakes from a stall waits for the
	// lease check; a lease lost meanwhile changes nothing for it (the
	// cleanup is fenced by the binding's epoch, whoever acts first).
	if err := rt.svc.AwaitNodeLease(ctx); err != nil && !errors.Is(err, joblib.ErrNodeLeaseLost) {
		return
	}
	res, err := rt.svc.CleanupWorker(ctx, wid, joblib.DisconnectCleanup(epoch))
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			rt.log.Error("disconnect cleanup", "worker", wid, "err", err)
		}
		return
	}
	if res.Cleaned == 0 {
		rt.log.Debug("worker re-attached within grace; kept", "worker", wid)
	}
}

// recheck disconnects the sockets whose credential stopped authenticating
// (revoked, expired, user deactivated), so that a revocation also ends open
// connections (and with them the heartbeats they keep fresh) on every node,
// and takes sockets out of the rooms the room authorization host no longer
// grants them. It ticks four times per credential cache period and reuses
// only answers young enough that a revoked credential's sockets close, and a
// withdrawn room is left, within the cache TTL of the answer (plus the time
// the tick takes): a tick every TTL reusing answers up to TTL old took up to
// twice that. Most checks are answered by the caches.
func (rt *Realtime) recheck() {
	every, credAge, roomAge := rt.recheckTimes()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-rt.stop:
			return
		case <-t.C:
		}
		rt.mu.Lock()
		socks := make([]*sio.Socket, 0, len(rt.socks))
		for s := range rt.socks {
			socks = append(socks, s)
		}
		rt.mu.Unlock()
		// A few goroutines share the sockets: a slow answer must not hold
		// up the whole tick, and most checks are cache hits not worth a
		// goroutine each.
		const workers = 8
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := w; i < len(socks); i += workers {
					select {
					case <-rt.stop:
						return
					default:
					}
					rt.recheckSocket(socks[i], credAge, roomAge)
				}
			})
		}
		wg.Wait()
	}
}

// recheckTimes are the re-check's period and the oldest credential and room
// answers it reuses.
func (rt *Realtime) recheckTimes() (every, credAge, roomAge time.Duration) {
	ttl := rt.auth.cache.ttl
	if ttl <= 0 {
		ttl = DefaultCredentialCacheTTL
	}
	every = max(ttl/4, 100*time.Millisecond)
	credAge = max(ttl-every, 0)
	if rt.rooms != nil {
		roomAge = max(rt.rooms.cfg.CacheTTL-every, 0)
	}
	return every, credAge, roomAge
}

// recheckSocket is recheck for one socket.
func (rt *Realtime) recheckSocket(s *sio.Socket, credAge, roomAge time.Duration) {
	st, _ := s.Data().(*connState)
	if st == nil {
		return
	}
	if !st.anon {
		ctx, cancel := context.WithTimeout(rt.ctx, 5*time.Second)
		_, err := rt.auth.authenticateFresh(ctx, st.token, credAge)
		cancel()
		if errors.Is(err, joblib.ErrUnauthorized) {
			rt.log.Info("socket credential no longer valid; disconnecting", "socket", s.ID(), "user", st.p.Name, "err", err)
			s.Disconnect()
			return
		}
	}
	if rt.rooms == nil {
		return
	}
	st.mu.Lock()
	gates := make(map[string]roomGate, len(st.gates))
	maps.Copy(gates, st.gates)
	st.mu.Unlock()
	for sioRoom, g := range gates {
		// Each question has the host's own timeout: a socket in many rooms
		// does not run out of time and leave the last ones as unavailable.
		reason := refusal(rt.rooms.checkFresh(rt.ctx, st.p, st.token, g.room, g.access, roomAge))
		if reason == "" || rt.ctx.Err() != nil {
			continue
		}
		st.mu.Lock()
		same := st.gates[sioRoom] == g
		if same {
			delete(st.gates, sioRoom)
		}
		st.mu.Unlock()
		if same && s.Leave(sioRoom) {
			rt.log.Info("socket left a room the host no longer grants", "socket", s.ID(), "user", st.p.Name, "room", g.room, "reason", reason)
			_ = s.Emit(roomLeftEvent, roomLeft(g, reason))
		}
	}
}

// roomLeftEvent tells a socket it was taken out of a room (see roomLeft).
const roomLeftEvent = "room_left"

// Why a socket leaves a room (room_left's reason).
const (
	leftForbidden   = "forbidden"   // the host refused the caller the room
	leftUnavailable = "unavailable" // the host did not answer, and room auth fails closed
)

// refusal names why err refuses a room ("" when it does not).
func refusal(err error) string {
	if err == nil {
		return ""
	}
	if e, ok := joblib.AsError(err); ok && e.Code == joblib.CodeForbidden {
		return leftForbidden
	}
	if errors.Is(err, errRoomAuthUnavailable) {
		return leftUnavailable
	}
	return ""
}

// roomLeft is the payload of room_left.
func roomLeft(g roomGate, reason string) map[string]string {
	m := map[string]string{"room": g.room, "reason": reason}
	if g.job != "" {
		m["job_name"] = g.job
	}
	if g.provider != "" {
		m["provider_name"] = g.provider
	}
	return m
}

// admitRooms asks the host again about the UI rooms of a session being
// recovered (RecoveryConfig.Admit), reusing only answers the re-check would
// reuse: a room it refuses is not restored, and the client hears room_left
// for it after its CONNECT; a room it cannot answer for is refused too
// unless room auth fails open.
func (rt *Realtime) admitRooms(ctx context.Context, s *sio.Socket, rooms []string) []string {
	st, _ := s.Data().(*connState)
	if rt.rooms == nil || st == nil {
		return rooms
	}
	ctx, cancel := context.WithTimeout(ctx, rt.rooms.cfg.Timeout)
	defer cancel()
	_, _, roomAge := rt.recheckTimes()
	kept := rooms[:0]
	for _, sioRoom := range rooms {
		id, ok := strings.CutPrefix(sioRoom, events.Room(""))
		if !ok {
			kept = append(kept, sioRoom)
			continue
		}
		g := roomGate{room: id, access: accessRead}
		if err := rt.rooms.checkFresh(ctx, st.p, st.token, id, accessRead, roomAge); err != nil {
			reason := cmp.Or(refusal(err), leftUnavailable)
			rt.log.Info("recovered socket not given back a room", "socket", s.ID(), "user", st.p.Name, "room", id, "reason", reason)
			_ = s.Emit(roomLeftEvent, roomLeft(g, reason))
			continue
		}
		st.gate(sioRoom, g)
		kept = append(kept, sioRoom)
	}
	return kept
}

// keepAlive refreshes the heartbeats of this node's socket-bound workers.
func (rt *Realtime) keepAlive() {
	t := time.NewTicker(rt.cfg.KeepAliveInterval)
	defer t.Stop()
	for {
		select {
		case <-rt.stop:
			return
		case <-t.C:
		}
		rt.mu.Lock()
		ids := make([]uuid.UUID, 0, len(rt.bound))
		for id := range rt.bound {
			ids = append(ids, id)
		}
		rt.mu.Unlock()
		if len(ids) == 0 {
			continue
		}
		gone, err := rt.svc.KeepAlive(rt.ctx, ids)
		if err != nil && !errors.Is(err, context.Canceled) {
			rt.log.Error("refresh socket-bound workers", "workers", len(ids), "err", err)
		}
		rt.dropWorkers(gone, "removed elsewhere")
	}
}

// wantsOffsets reports whether a connecting client asked for connection
// state recovery with "recover": true in its CONNECT auth. Only those get
// the trailing offset argument: a python-socketio handler written as
// `def on_event(data)` fails on an extra argument, and a UI that does not
// look at socket.recovered refetches after every reconnection anyway.
func wantsOffsets(auth json.RawMessage) bool {
	var a struct {
		Recover bool `json:"recover"`
	}
	return len(auth) > 0 && json.Unmarshal(auth, &a) == nil && a.Recover
}

// socketOwner names who a socket belongs to, for connection state recovery:
// a session is restored only to the same user (or to another anonymous
// reader).
func socketOwner(s *sio.Socket) string {
	st, _ := s.Data().(*connState)
	switch {
	case st == nil:
		return ""
	case st.anon:
		return "anonymous"
	}
	return st.p.ID.String()
}

// sessionStore is where disconnected sockets' sessions are kept: the
// database on PostgreSQL (any node may recover them), else memory.
// sessionStore keeps the sessions of disconnected sockets in PostgreSQL when
// the bus is PostgreSQL's, whose NOTIFY queue gives every node one order of
// delivery, so that an offset means the same on every node. With another bus
// (NATS orders each publisher's messages, not their interleaving) or on
// SQLite, sessions stay in the node's memory: a client recovers on the node
// it was on, and elsewhere gets a fresh session, never a wrong replay.
func sessionStore(db *models.DB, bus events.Bus) sio.SessionStore {
	if _, ok := bus.(*events.PGBus); ok && db != nil && db.Pool != nil {
		return dbSessionStore{db}
	}
	return nil
}

type dbSessionStore struct{ db *models.DB }

func (d dbSessionStore) Save(ctx context.Context, s sio.Session, ttl time.Duration) error {
	rooms, err := json.Marshal(s.Rooms)
	if err != nil {
		return err
	}
	return d.db.SaveSocketSession(ctx, models.SocketSession{PID: s.PID, SID: s.SID, Rooms: string(rooms), Owner: s.Owner}, ttl)
}

func (d dbSessionStore) Take(ctx context.Context, pid string) (sio.Session, bool, error) {
	ms, ok, err := d.db.TakeSocketSession(ctx, pid)
	if err != nil || !ok {
		return sio.Session{}, false, err
	}
	s := sio.Session{PID: ms.PID, SID: ms.SID, Owner: ms.Owner}
	if err := json.Unmarshal([]byte(ms.Rooms), &s.Rooms); err != nil {
		return sio.Session{}, false, fmt.Errorf("read socket session rooms: %w", err)
	}
	return s, true, nil
}

// purgeRecovery drops the recorded room events past the recovery window and
// deletes expired socket sessions from the database (PostgreSQL) every
// quarter window (at most every 30 s), whether or not anything happens
// meanwhile: an idle node lets go of them.
func (rt *Realtime) purgeRecovery() {
	t := time.NewTicker(min(rt.cfg.RecoveryWindow/4, 30*time.Second))
	defer t.Stop()
	for {
		select {
		case <-rt.stop:
			return
		case <-t.C:
		}
		rt.io.Namespace("/").TrimHistory()
		if rt.svc.DB().Pool == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(rt.ctx, 10*time.Second)
		_, err := rt.svc.DB().PurgeSocketSessions(ctx)
		cancel()
		if err != nil && rt.ctx.Err() == nil {
			rt.log.Warn("purge socket sessions", "err", err)
		}
	}
}
