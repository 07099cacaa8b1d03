package server

// The event router: CONNECT authentication, the client events and their
// acks, and delivery of committed bus events to rooms.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/clientaddr"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/server/sio"
)

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
		err = rt.io.EmitHintTo(e.Room, e.Event.EventName(), sio.JSON(e.Payload()))
	default:
		if e.Offset != "" && strings.HasPrefix(e.Room, events.Room("")) {
			err = rt.io.EmitToAt(e.Room, e.Offset, e.Event.EventName(), sio.JSON(e.Payload()))
		} else {
			err = rt.io.EmitTo(e.Room, e.Event.EventName(), sio.JSON(e.Payload()))
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
	code := joblib.CodePayloadTooLarge
	if limit == sio.LimitDepth {
		code = joblib.CodeValidation
	}
	return []any{problemAck(code, detail)}
}

// problemAck is the ack of an error the router finds itself (bad arguments,
// no credential, a socket budget): the status and problem type REST answers
// for the same code.
func problemAck(code joblib.Code, detail string) ack {
	p := newProblem(code, detail)
	a := ack{Status: p.Status, Type: p.Type, Detail: detail}
	if a.Status == http.StatusTooManyRequests {
		a.RetryAfter = 1 // as writeProblem: every 429 says when to come back
	}
	return a
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
	ctx, cancel := rt.readBudget(ctx)
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
	OK     bool `json:"ok"`
	Status int  `json:"status,omitempty"`
	// Type is the problem type REST answers for the same error (set for
	// the errors classify answers).
	Type   string `json:"type,omitempty"`
	Detail string `json:"detail,omitempty"`
	// RetryAfter is REST's Retry-After for the same error, in seconds.
	RetryAfter int `json:"retry_after,omitempty"`
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
	ctx, cancel := rt.writeBudget(ctx)
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
			return problemAck(joblib.CodeValidation, "the event's argument must be a JSON object")
		}
	}
	switch ev.Name {
	case "join_job_room", "leave_job_room":
		if body.JobName == nil || body.WorkerID == nil {
			return problemAck(joblib.CodeValidation, "job_name and worker_id are required")
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
			return problemAck(joblib.CodeValidation, "provider_name and worker_id are required")
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
			return problemAck(joblib.CodeValidation, "room_id is required")
		}
		if err := joblib.ValidateRoomID(*body.RoomID); err != nil {
			return rt.errAck(ctx, err)
		}
		room := events.Room(*body.RoomID)
		if ev.Name == "leave_room" {
			s.Leave(room)
			st.ungate(room)
			return ack{OK: true}
		}
		if rt.rooms != nil {
			if err := rt.rooms.check(clientaddr.NewContext(ctx, s.RemoteAddr()), st.p, st.token, *body.RoomID, accessRead); err != nil {
				return rt.errAck(ctx, err)
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
		return problemAck(joblib.CodeUnauthorized, "Unauthorized")
	}
	if rawWorker == nil {
		return problemAck(joblib.CodeValidation, "worker_id is required")
	}
	wid, err := uuid.Parse(*rawWorker)
	if err != nil {
		return problemAck(joblib.CodeValidation, "worker_id must be a UUID")
	}
	limit := 1
	if rawLimit != nil {
		limit = *rawLimit
	}
	ts, err := rt.svc.ClaimTasks(ctx, st.p, wid, limit, start)
	if err != nil {
		return rt.errAck(ctx, err)
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
		return problemAck(joblib.CodeUnauthorized, "Unauthorized")
	}
	ups, err := decodeTaskUpdates(raw)
	if err != nil {
		return problemAck(joblib.CodeValidation, err.Error())
	}
	rs, err := rt.svc.UpdateTasks(ctx, st.p, ups)
	if err != nil {
		return rt.errAck(ctx, err)
	}
	return ack{OK: true, Results: taskUpdateItems(ctx, rt.log, rs)}
}

// taskProgress is a worker's progress report over its socket
// (task_progress {task_id, current, total, message}), answered as PATCH
// /tasks/{id} with {"progress": ...} would be.
func (rt *Realtime) taskProgress(ctx context.Context, st *connState, args []json.RawMessage) ack {
	if st.anon {
		return problemAck(joblib.CodeUnauthorized, "Unauthorized")
	}
	var b struct {
		TaskID *string `json:"task_id"`
		joblib.Progress
	}
	if len(args) == 0 || json.Unmarshal(args[0], &b) != nil || b.TaskID == nil {
		return problemAck(joblib.CodeValidation, "task_id is required; current and total are numbers, message a string")
	}
	id, err := uuid.Parse(*b.TaskID)
	if err != nil {
		return problemAck(joblib.CodeValidation, "task_id must be a UUID")
	}
	if _, err := rt.svc.ReportProgress(ctx, st.p, id, b.Progress); err != nil {
		return rt.errAck(ctx, err)
	}
	return ack{OK: true}
}

// joinErrAck answers a join past the rooms-per-socket budget.
func joinErrAck(err error) ack {
	return problemAck(joblib.CodeRateLimited, err.Error())
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

// errAck answers err as REST would (classify): the same status, problem
// type and Retry-After, in the ack.
func (rt *Realtime) errAck(ctx context.Context, err error) ack {
	v := classify(ctx, err)
	if v.Log != "" {
		rt.log.LogAttrs(ctx, v.LogLevel, "socket event: "+v.Log, slog.Any("err", err))
	}
	return ack{Status: v.Status, Type: v.Type, Detail: v.Detail, RetryAfter: retryAfterSeconds(v.RetryAfter)}
}
