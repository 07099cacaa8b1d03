package sio

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/zndraw/joblib/internal/sio/wire"
	"github.com/zndraw/joblib/server/sio/engineio"
)

type sockState int

const (
	sockConnecting sockState = iota // OnConnect running: output is held back
	sockConnected
	sockGone
)

// Socket is the connection of one Engine.IO session to one namespace. Its
// methods are safe for concurrent use.
type Socket struct {
	id string
	c  *client
	ns *Namespace

	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	state    sockState
	accepted bool                // OnConnect succeeded
	finished bool                // OnDisconnect called
	held     []*engineio.Message // output produced while OnConnect runs
	rooms    map[string]struct{} // joined rooms, not the own room
	ownRoom  bool                // in the room named by its id
	acks     map[uint64]chan []json.RawMessage
	nextAck  uint64
	data     any

	// Connection state recovery (see recovery.go).
	pid       string          // private session id sent with CONNECT
	recovered bool            // the session was restored
	restore   *pendingRestore // the session CONNECT asked for, until accept
	gotOffset atomic.Bool     // a recorded broadcast was queued to it
	offsets   atomic.Bool     // the client takes offsets (RecoveryConfig.Wants)
}

func newSocket(c *client, ns *Namespace) *Socket {
	sock := &Socket{id: engineio.RandomID(), c: c, ns: ns}
	sock.ctx, sock.cancel = context.WithCancel(context.Background())
	return sock
}

// ID returns the public socket id (also the name of the socket's own room). It is
// not the Engine.IO session id.
func (s *Socket) ID() string { return s.id }

// Namespace returns the socket's namespace.
func (s *Socket) Namespace() *Namespace { return s.ns }

// Context returns a context that is cancelled when the socket is gone.
func (s *Socket) Context() context.Context { return s.ctx }

// RemoteAddr returns the client address of the socket's session.
func (s *Socket) RemoteAddr() string { return s.c.conn.RemoteAddr() }

// Transport returns "polling" or "websocket".
func (s *Socket) Transport() string { return s.c.conn.Transport() }

// SetData stores per-connection state for the embedding server.
func (s *Socket) SetData(v any) {
	s.mu.Lock()
	s.data = v
	s.mu.Unlock()
}

// Data returns what SetData stored.
func (s *Socket) Data() any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.data
}

// Join adds the socket to room. It is a no-op once the socket is gone, and
// returns ErrTooManyRooms when the socket is already in Config.MaxRooms rooms.
func (s *Socket) Join(room string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == sockGone {
		return nil
	}
	if room == s.id {
		if !s.ownRoom {
			s.ownRoom = true
			s.ns.rooms.joinOwn(s)
		}
		return nil
	}
	if _, ok := s.rooms[room]; ok {
		return nil
	}
	if s.roomCountLocked() >= s.c.srv.cfg.MaxRooms {
		s.c.srv.cfg.OnReject(LimitRooms)
		return ErrTooManyRooms
	}
	if s.rooms == nil {
		s.rooms = make(map[string]struct{}, 1)
	}
	s.rooms[room] = struct{}{}
	s.ns.rooms.join(room, s)
	return nil
}

func (s *Socket) roomCountLocked() int {
	n := len(s.rooms)
	if s.ownRoom {
		n++
	}
	return n
}

// Leave removes the socket from room and reports whether it was in it.
func (s *Socket) Leave(room string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if room == s.id && s.ownRoom {
		s.ownRoom = false
		s.ns.rooms.leaveOwn(s)
		return true
	}
	if _, ok := s.rooms[room]; !ok {
		return false
	}
	delete(s.rooms, room)
	s.ns.rooms.leave(room, s)
	return true
}

// Rooms returns the rooms the socket is in, sorted; the socket's own id is one
// of them while it is connected.
func (s *Socket) Rooms() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	rooms := make([]string, 0, s.roomCountLocked())
	for r := range s.rooms {
		rooms = append(rooms, r)
	}
	if s.ownRoom {
		rooms = append(rooms, s.id)
	}
	slices.Sort(rooms)
	return rooms
}

// Emit sends an event to this socket without blocking. []byte arguments (at the
// top level or inside []any / map[string]any) become binary attachments. It
// returns ErrReservedEvent for reserved names, ErrClosed once the socket is gone,
// and ErrSlowConsumer if the send queue is full (the connection is then closed
// with reason "slow consumer").
func (s *Socket) Emit(event string, args ...any) error {
	m, err := encodeEvent(s.ns.name, event, args, 0, false)
	if err != nil {
		return err
	}
	return s.send(m)
}

// EmitHint sends an event the client can do without (see
// Namespace.EmitHintTo). It reports whether the event was queued.
func (s *Socket) EmitHint(event string, args ...any) (bool, error) {
	m, err := encodeEvent(s.ns.name, event, args, 0, false)
	if err != nil {
		return false, err
	}
	return s.hint(m), nil
}

// EmitWithAck sends an event with an ack id and waits for the client's ack, ctx,
// or the socket to go away (ErrClosed). The ack arguments are returned as JSON;
// in a binary ack each placeholder is replaced by the base64 string of its
// attachment, so json.Unmarshal into a []byte field recovers the bytes.
func (s *Socket) EmitWithAck(ctx context.Context, event string, args ...any) ([]json.RawMessage, error) {
	ch := make(chan []json.RawMessage, 1)
	s.mu.Lock()
	if s.state == sockGone {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	id := s.nextAck
	s.nextAck++
	if s.acks == nil {
		s.acks = make(map[uint64]chan []json.RawMessage)
	}
	s.acks[id] = ch
	s.mu.Unlock()
	drop := func() {
		s.mu.Lock()
		delete(s.acks, id)
		s.mu.Unlock()
	}

	m, err := encodeEvent(s.ns.name, event, args, id, true)
	if err != nil {
		drop()
		return nil, err
	}
	if err := s.send(m); err != nil {
		drop()
		return nil, err
	}
	select {
	case res := <-ch:
		return res, nil
	case <-ctx.Done():
		drop()
		return nil, fmt.Errorf("wait for ack of %q: %w", event, ctx.Err())
	case <-s.ctx.Done():
		return nil, fmt.Errorf("wait for ack of %q: %w", event, ErrClosed)
	}
}

func (s *Socket) resolveAck(id uint64, args []json.RawMessage) {
	s.mu.Lock()
	ch := s.acks[id]
	delete(s.acks, id)
	s.mu.Unlock()
	if ch != nil {
		ch <- args
	}
}

func (s *Socket) ackFunc(id uint64) AckFunc {
	var sent atomic.Bool
	return func(args ...any) error {
		if !sent.CompareAndSwap(false, true) {
			return ErrAckSent
		}
		m, err := encodeAck(s.ns.name, id, args)
		if err != nil {
			return err
		}
		return s.send(m)
	}
}

// Disconnect ends the socket from the server side: the client gets DISCONNECT
// ("io server disconnect" in JS; it does not reconnect by itself) after every
// packet queued before it, the socket leaves its rooms at once, and OnDisconnect
// gets "server namespace disconnect". When that was the session's last
// namespace the clients close the Engine.IO session themselves (socket.io-client
// handles a DISCONNECT a tick later than an engine close in the same poll, so
// the server must not close first); if a client does not, the server closes it
// after PingTimeout.
func (s *Socket) Disconnect() {
	c := s.c
	c.mu.Lock()
	if c.gone || !c.detachLocked(s, c.srv.cfg.PingTimeout) {
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	last := sioMsg(wire.SIOPacket{Type: wire.SIODisconnect, Namespace: s.ns.name}, nil)
	_ = s.goneAfter(last)
	c.dispatch(inbound{kind: inDisconnect, sock: s, reason: ReasonServerNamespaceDisconnect}, true)
}

// Close drops the whole Engine.IO session (every namespace) without a
// namespace disconnect, so the client reconnects. OnDisconnect receives
// reason; a websocket client sees close code 4000 with reason as text (or the
// code of a matching Reason* constant).
func (s *Socket) Close(reason string) { s.c.close(reason) }

// send queues m, or holds it back while OnConnect runs. The session is
// called without s.mu held: a full queue closes the session, which takes
// s.mu to detach the socket.
func (s *Socket) send(m *engineio.Message) error {
	s.mu.Lock()
	switch s.state {
	case sockGone:
		s.mu.Unlock()
		return ErrClosed
	case sockConnecting:
		if len(s.held) >= s.c.srv.cfg.SendQueue {
			s.mu.Unlock()
			s.c.close(ReasonSlowConsumer)
			return ErrSlowConsumer
		}
		s.held = append(s.held, m)
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	return mapSendErr(s.c.conn.Send(m))
}

// queue is send for a broadcast: the caller flushes the session afterwards.
func (s *Socket) queue(m *engineio.Message) error {
	if !s.isConnected() {
		return ErrClosed
	}
	return mapSendErr(s.c.conn.Queue(m))
}

func (s *Socket) hint(m *engineio.Message) bool {
	return s.isConnected() && s.c.conn.SendHint(m)
}

func mapSendErr(err error) error {
	switch {
	case errors.Is(err, engineio.ErrSlowConsumer):
		return ErrSlowConsumer
	case errors.Is(err, engineio.ErrClosed):
		return ErrClosed
	}
	return err
}

// accept runs after OnConnect succeeded: reply CONNECT, release held output, join
// the socket's own room.
func (s *Socket) accept() {
	rc := &s.c.srv.rc
	var missed []*engineio.Message
	var restored []string
	if rc.Window > 0 {
		s.mu.Lock()
		pr := s.restore
		s.restore = nil
		s.mu.Unlock()
		if pr != nil && (rc.Owner == nil || rc.Owner(s) == pr.sess.Owner) {
			// Held until the socket is in its rooms and its replay is
			// queued, so that no recorded broadcast falls in between.
			s.ns.hist.mu.Lock()
			defer s.ns.hist.mu.Unlock()
			if msgs, ok := s.ns.hist.sinceLocked(pr.offset, pr.sess.Rooms, rc); ok {
				missed, restored = msgs, pr.sess.Rooms
				s.mu.Lock()
				s.id, s.pid, s.recovered = pr.sess.SID, pr.sess.PID, true
				s.mu.Unlock()
			}
		}
	}
	s.mu.Lock()
	s.accepted = true
	if s.state != sockConnecting {
		s.mu.Unlock()
		return
	}
	reply := map[string]string{"sid": s.id}
	if rc.Window > 0 {
		if s.pid == "" {
			s.pid = engineio.RandomID() + engineio.RandomID()
		}
		reply["pid"] = s.pid
	}
	for _, room := range restored {
		if _, ok := s.rooms[room]; ok || room == s.id {
			continue
		}
		if s.rooms == nil {
			s.rooms = make(map[string]struct{}, len(restored))
		}
		s.rooms[room] = struct{}{}
		s.ns.rooms.join(room, s)
	}
	if s.recovered {
		s.gotOffset.Store(true) // the client holds an offset
	}
	payload, _ := json.Marshal(reply)
	msgs := make([]*engineio.Message, 0, 1+len(missed)+len(s.held))
	msgs = append(msgs, sioMsg(wire.SIOPacket{Type: wire.SIOConnect, Namespace: s.ns.name, Data: payload}, nil))
	msgs = append(msgs, missed...)
	msgs = append(msgs, s.held...)
	s.held = nil
	s.state = sockConnected
	// In its own room before the client hears of the connection.
	joinedOwn := !s.ownRoom
	if joinedOwn {
		s.ownRoom = true
		s.ns.rooms.joinOwn(s)
	}
	// SendAll does not close the session on overflow (it would take s.mu).
	err := s.c.conn.SendAll(msgs)
	if err != nil && joinedOwn {
		s.ownRoom = false
		s.ns.rooms.leaveOwn(s)
	}
	s.mu.Unlock()
	if errors.Is(err, engineio.ErrSlowConsumer) {
		s.c.close(ReasonSlowConsumer)
	}
}

// gone detaches the socket: no more output, rooms left, context cancelled.
func (s *Socket) gone() { _ = s.goneAfter(nil) }

// goneAfter is gone, with last (if not nil) queued as the socket's final packet.
func (s *Socket) goneAfter(last *engineio.Message) error {
	s.mu.Lock()
	if s.state == sockGone {
		s.mu.Unlock()
		return ErrClosed
	}
	sendLast := last != nil && s.state == sockConnected
	s.state = sockGone
	rooms, own := s.rooms, s.ownRoom
	s.rooms, s.ownRoom = nil, false
	s.held = nil
	s.acks = nil
	s.mu.Unlock()
	s.ns.rooms.leaveAll(rooms, s)
	if own {
		s.ns.rooms.leaveOwn(s)
	}
	s.cancel()
	if sendLast {
		return mapSendErr(s.c.conn.Send(last))
	}
	return nil
}

func (s *Socket) isGone() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state == sockGone
}

func (s *Socket) isConnected() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state == sockConnected
}

// finish reports whether OnDisconnect is due now (once, and only if accepted).
func (s *Socket) finish() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.accepted || s.finished {
		return false
	}
	s.finished = true
	return true
}
