// Package sio is a Socket.IO v5 server on the Engine.IO v4 server of package
// engineio (websocket, HTTP long-polling and the upgrade between them). It
// speaks to unmodified socket.io-client 4.x and python-socketio 5.x:
// namespaces (each with its own handler and auth, several multiplexed on one
// Engine.IO session), rooms, acknowledgements in both directions and binary
// attachments. The packet codec lives in package internal/sio/wire, shared with
// the Go client (internal/sio/sioclient).
//
// # API
//
//	func New(cfg Config, h Handler) *Server             // h serves namespace "/"
//	func (*Server) Of(name string, h Handler) *Namespace // register another namespace
//	func (*Server) ServeHTTP(w http.ResponseWriter, r *http.Request) // mount at "/socket.io/"
//	func (*Server) EmitTo(room, event string, args ...any) error     // namespace "/"
//	func (*Server) EmitHintTo(room, event string, args ...any) error
//	func (*Server) RoomSize(room string) int
//	func (*Server) NumSockets() int
//	func (*Server) Engine() *engineio.Server
//	func (*Server) Shutdown(ctx context.Context) error
//
//	func (*Namespace) EmitTo(room, event string, args ...any) error
//	func (*Namespace) EmitHintTo(room, event string, args ...any) error
//	func (*Namespace) RoomSize(room string) int
//	func (*Namespace) NumSockets() int
//
//	type Handler interface {
//		OnConnect(ctx context.Context, s *Socket, req *http.Request, auth json.RawMessage) error
//		OnEvent(ctx context.Context, s *Socket, ev Event, ack AckFunc)
//		OnDisconnect(s *Socket, reason string)
//	}
//	type Event struct{ Name string; Args []json.RawMessage; Attachments [][]byte }
//	type AckFunc func(args ...any) error
//
//	func (*Socket) ID() string
//	func (*Socket) Namespace() *Namespace
//	func (*Socket) Join(room string) error
//	func (*Socket) Leave(room string)
//	func (*Socket) Rooms() []string
//	func (*Socket) Emit(event string, args ...any) error
//	func (*Socket) EmitHint(event string, args ...any) (bool, error)
//	func (*Socket) EmitWithAck(ctx context.Context, event string, args ...any) ([]json.RawMessage, error)
//	func (*Socket) Disconnect()
//	func (*Socket) Close(reason string)
//	func (*Socket) Transport() string
//	func (*Socket) SetData(v any)
//	func (*Socket) Data() any
//	func (*Socket) Context() context.Context
//
// EmitTo returns an error (unlike a fire-and-forget broadcast) because a reserved
// event name or an argument that encoding/json rejects must not pass silently.
// It encodes the packet once; every member's session queues the same bytes.
//
// # Namespaces
//
// A client's CONNECT for a namespace that is not registered gets
// CONNECT_ERROR {"message":"Invalid namespace"} and its session stays up.
// Each namespace has its own rooms. A session that is in no namespace within
// Config.ConnectTimeout of opening (or of leaving its last one) is closed
// (close code 4003); refused CONNECTs do not extend that time.
//
// # Budgets
//
// Config.MaxAttachments (attachments one packet may announce),
// Config.MaxEventBytes (a packet with its attachments, counted as they
// arrive: past it they are dropped at once), Config.MaxDepth (nesting of an
// event's arguments, checked in one pass before anything decodes them) and
// Config.MaxRooms (rooms per socket). A packet past a budget gets the ack
// built by Config.RejectAck if it asked for one, otherwise its session is
// closed (close code 4010, the budget's reason); Join past MaxRooms returns
// ErrTooManyRooms. Every refusal is reported to Config.OnReject.
//
// # Handler calls
//
// OnConnect, OnEvent and OnDisconnect for one session (all its namespaces) run
// one at a time, in the
// order the packets arrived, on a goroutine that is started on demand and is not
// the transport's reader: a slow handler never delays pongs or other
// connections. Packets of one connection still wait for that connection's
// earlier handler calls; work that may take long belongs on a goroutine of its
// own (use Socket.Context to stop it). Acks from the client (for EmitWithAck) are
// resolved by the reader directly, so EmitWithAck may be called from OnEvent.
// OnDisconnect is called exactly once for every socket whose OnConnect returned
// nil, after its last OnEvent returned; Socket.Context is cancelled and the
// socket has left all rooms by then (at the moment the socket went away).
//
// # Outbound flow control
//
// Every session has one bounded queue (Config.SendQueue packets) and at most
// one writer. Emit, acks and EmitTo never block: EmitTo encodes once, snapshots
// the room and enqueues to each member; a member whose queue is full is closed
// with reason "slow consumer" (close code 4008) and the broadcast goes on.
// EmitHintTo sends hints: events a receiver can do without, dropped for a
// member that is behind instead of closing it. Heartbeat pings jump the queue.
//
// # Connection state recovery
//
// With Config.Recovery.Window set, the CONNECT reply carries a private
// session id (pid), Namespace.EmitToAt records a broadcast under an offset
// that is sent as its last argument (to clients RecoveryConfig.Wants), and a
// socket that goes away for a reason the client reconnects after (transport
// close or error, ping timeout, slow consumer, server shutdown) leaves its
// session in RecoveryConfig.Store. A CONNECT with that pid and an offset
// still recorded gets the socket id and rooms back and the recorded
// broadcasts of those rooms after the offset, in order and exactly once,
// before anything else; socket.io-client ≥ 4.6 then reports
// socket.recovered. See recovery.go.
//
// # Disconnect reasons and websocket close codes
//
//	reason                         code  client behaviour
//	transport close                1000  reconnects (the client closed, or sent an engine close)
//	client namespace disconnect    1000  terminal (client called disconnect())
//	server namespace disconnect    -     terminal (Socket.Disconnect; JS: "io server disconnect";
//	                                     the client closes the session, else the server after PingTimeout)
//	server shutting down           1001  reconnects
//	payload too large              1009  reconnects
//	ping timeout                   4001  reconnects
//	parse error                    4002  reconnects (invalid or out-of-place packet)
//	transport error                4004  reconnects (write failed or timed out, overlapping polls)
//	slow consumer                  4008  reconnects
//	event queue full               4009  reconnects (more than SendQueue events waiting for OnEvent)
//	too many attachments           4010  reconnects (Config.MaxAttachments)
//	event too large                4010  reconnects (Config.MaxEventBytes)
//	nesting too deep               4010  reconnects (Config.MaxDepth)
//	<Socket.Close reason>          4000  reconnects
//
// A session that is in no namespace within ConnectTimeout is closed (code
// 4003); no socket exists, so no handler is called.
//
// # Shutdown
//
// Shutdown refuses new sessions (503), closes every session with reason
// "server shutting down" (OnDisconnect is called for each connected socket) and
// waits until every goroutine the server started has exited, including running
// handler calls. If its ctx expires first it cuts the remaining connections,
// waits for the goroutines that unblocks, and returns the ctx error. Shutdown
// does not stop the http.Server the handler is mounted on.
//
// # Deployment notes
//
//   - An http.Server WriteTimeout shorter than a long-poll is extended per poll
//     (http.ResponseController); hijacked websockets are not affected.
//   - Browsers on another origin need that origin in Config.OriginPatterns, for
//     websocket as well as for polling (CORS with credentials).
//   - Polling needs sticky sessions behind a load balancer; websocket-only
//     clients do not.
package sio
