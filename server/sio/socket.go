package sio

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/zndraw/joblib/server/sio/wire"
)

type sockState int

const (
	sockConnecting sockState = iota // OnConnect running: output is held back
	sockConnected
	sockGone
)

// Socket is the namespace "/" connection of one Engine.IO session. Its methods
// are safe for concurrent use.
type Socket struct {
	id   string
	sess *session
	srv  *Server

	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	state    sockState
	accepted bool     // OnConnect succeeded
	finished bool     // OnDisconnect called
	held     []outMsg // output produced while OnConnect runs
	rooms    map[string]struct{}
	acks     map[uint64]chan []json.RawMessage
	nextAck  uint64
	data     any
}

func newSocket(s *session) *Socket {
	sock := &Socket{id: randomID(), sess: s, srv: s.srv, rooms: make(map[string]struct{})}
	sock.ctx, sock.cancel = context.WithCancel(s.srv.ctx)
	return sock
}

// ID returns the public socket id (also the name of the socket's own room). It is
// not the Engine.IO session id.
func (s *Socket) ID() string { return s.id }

// Context returns a context that is cancelled when the socket is gone.
func (s *Socket) Context() context.Context { return s.ctx }

// Transport returns "polling" or "websocket".
func (s *Socket) Transport() string {
	s.sess.mu.Lock()
	defer s.sess.mu.Unlock()
	return s.sess.transport
}

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

// Join adds the socket to room. It is a no-op once the socket is gone.
func (s *Socket) Join(room string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == sockGone {
		return
	}
	if _, ok := s.rooms[room]; ok {
		return
	}
	s.rooms[room] = struct{}{}
	s.srv.rooms.join(room, s)
}

// Leave removes the socket from room.
func (s *Socket) Leave(room string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.rooms[room]; !ok {
		return
	}
	delete(s.rooms, room)
	s.srv.rooms.leave(room, s)
}

// Rooms returns the rooms the socket is in, sorted; the socket's own id is one
// of them while it is connected.
func (s *Socket) Rooms() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	rooms := make([]string, 0, len(s.rooms))
	for r := range s.rooms {
		rooms = append(rooms, r)
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
	m, err := encodeEvent(event, args, 0, false)
	if err != nil {
		return err
	}
	return s.send(m)
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

	m, err := encodeEvent(event, args, id, true)
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
		m, err := encodeAck(id, args)
		if err != nil {
			return err
		}
		return s.send(m)
	}
}

// Disconnect ends the socket from the server side: the client gets DISCONNECT
// ("io server disconnect" in JS; it does not reconnect by itself) after every
// packet queued before it, the socket leaves its rooms at once, and OnDisconnect
// gets "server namespace disconnect". The clients then close the Engine.IO
// session themselves (socket.io-client handles a DISCONNECT a tick later than an
// engine close in the same poll, so the server must not close first); if a
// client does not, the server closes it after PingTimeout.
func (s *Socket) Disconnect() {
	sess := s.sess
	sess.mu.Lock()
	if sess.sock != s || sess.closed {
		sess.mu.Unlock()
		return
	}
	sess.sock, sess.ns = nil, nsNone
	if sess.connectTimer != nil {
		sess.connectTimer.Reset(sess.srv.cfg.PingTimeout)
	}
	sess.mu.Unlock()
	last := sioMsg(wire.SIOPacket{Type: wire.SIODisconnect}, nil)
	err := s.goneAfter(&last)
	sess.dispatch(inbound{kind: inDisconnect, sock: s, reason: ReasonServerNamespaceDisconnect}, true)
	if errors.Is(err, errQueueFull) {
		sess.close(ReasonSlowConsumer, false)
	}
}

// Close drops the Engine.IO session without a namespace disconnect, so the
// client reconnects. OnDisconnect receives reason; a websocket client sees close
// code 4000 with reason as text (or the code of a matching Reason* constant).
func (s *Socket) Close(reason string) {
	s.sess.close(reason, false)
}

// send enqueues m, or holds it back while OnConnect runs.
func (s *Socket) send(m outMsg) error {
	err := s.sendQuiet(m)
	s.sess.q.signal()
	return err
}

// sendQuiet is send without waking the writer; see sendQueue.pushQuiet.
func (s *Socket) sendQuiet(m outMsg) error {
	s.mu.Lock()
	var err error
	switch s.state {
	case sockGone:
		err = ErrClosed
	case sockConnecting:
		if len(s.held) >= s.srv.cfg.SendQueue {
			err = errQueueFull
		} else {
			s.held = append(s.held, m)
		}
	default:
		err = s.sess.q.pushQuiet(m)
	}
	s.mu.Unlock()
	if errors.Is(err, errQueueFull) {
		s.sess.close(ReasonSlowConsumer, false)
		return ErrSlowConsumer
	}
	return err
}

// accept runs after OnConnect succeeded: reply CONNECT, release held output, join
// the socket's own room.
func (s *Socket) accept() {
	s.mu.Lock()
	s.accepted = true
	if s.state != sockConnecting {
		s.mu.Unlock()
		return
	}
	payload, _ := json.Marshal(map[string]string{"sid": s.id})
	msgs := append([]outMsg{sioMsg(wire.SIOPacket{Type: wire.SIOConnect, Data: payload}, nil)}, s.held...)
	s.held = nil
	s.state = sockConnected
	err := s.sess.q.pushAll(msgs)
	if err == nil {
		s.rooms[s.id] = struct{}{}
		s.srv.rooms.join(s.id, s)
	}
	s.mu.Unlock()
	if errors.Is(err, errQueueFull) {
		s.sess.close(ReasonSlowConsumer, false)
	}
}

// gone detaches the socket: no more output, rooms left, context cancelled.
func (s *Socket) gone() { _ = s.goneAfter(nil) }

// goneAfter is gone, with last (if not nil) queued as the socket's final packet.
func (s *Socket) goneAfter(last *outMsg) error {
	s.mu.Lock()
	if s.state == sockGone {
		s.mu.Unlock()
		return ErrClosed
	}
	var err error
	if last != nil && s.state == sockConnected {
		err = s.sess.q.push(*last)
	}
	s.state = sockGone
	rooms := s.rooms
	s.rooms = make(map[string]struct{})
	s.held = nil
	s.acks = nil
	s.mu.Unlock()
	s.srv.rooms.leaveAll(rooms, s)
	s.cancel()
	return err
}

func (s *Socket) isGone() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state == sockGone
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
