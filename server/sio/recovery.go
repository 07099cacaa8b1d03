package sio

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/zndraw/joblib/server/sio/engineio"
)

// Connection state recovery, as socket.io-client ≥ 4.6 expects it: with
// RecoveryConfig.Window set, the CONNECT reply carries a private session id
// (pid) besides the socket id, and every recorded broadcast (Namespace.EmitToAt)
// carries its offset as a trailing string argument, which the client keeps as
// its last offset. When a socket goes away for a reason the client recovers
// from (transport close or error, ping timeout, slow consumer, server
// shutdown), its id, pid and rooms are saved for Window. A later CONNECT
// whose auth holds that pid and an offset this node's history still holds
// gets the same socket id and rooms back, then the recorded broadcasts of
// those rooms that followed the offset, in order, and the client sees
// socket.recovered === true. Anything else (unknown or expired session,
// offset no longer held, more to replay than the bounds allow, another
// owner) is a fresh session, as without recovery.

// Defaults of RecoveryConfig's bounds.
const (
	DefaultRecoveryMaxPackets   = 1000
	DefaultRecoveryMaxBytes     = 4 << 20
	DefaultRecoveryHistoryBytes = 64 << 20
)

// RecoveryConfig configures connection state recovery. The zero value
// disables it.
type RecoveryConfig struct {
	// Window is how long a disconnected socket's session is kept, and how
	// long recorded broadcasts are kept to replay. 0 disables recovery.
	Window time.Duration
	// MaxPackets and MaxBytes bound what one socket may have replayed
	// (defaults DefaultRecoveryMaxPackets, DefaultRecoveryMaxBytes); a
	// socket that missed more gets a fresh session. MaxPackets is kept
	// below Config.SendQueue.
	MaxPackets int
	MaxBytes   int64
	// HistoryBytes bounds the recorded broadcasts kept by a namespace
	// (default DefaultRecoveryHistoryBytes); the oldest go first.
	HistoryBytes int64
	// Store keeps the sessions of disconnected sockets (default: this
	// process's memory). A store shared by several servers lets a client
	// recover on another one, provided the broadcasts carry the same
	// offsets there.
	Store SessionStore
	// Owner, if set, names who a socket belongs to (called after
	// Handler.OnConnect succeeded, and when the socket goes away); a session
	// is restored only for the same owner.
	Owner func(*Socket) string
	// Wants, if set, tells from a CONNECT's auth payload whether the
	// client takes offsets (nil: every client does). Offsets are a trailing
	// argument that a handler taking a fixed number of arguments (a
	// python-socketio `def on_event(data)`) does not expect; a client that
	// gets none is never recovered. A CONNECT that asks to recover (pid and
	// offset) always takes them.
	Wants func(auth json.RawMessage) bool
	// KeepRoom, if set, tells which rooms a kept session restores (nil:
	// all); the others are left as if the client had left them.
	KeepRoom func(room string) bool
	// Admit, if set, decides which rooms of a session being recovered the
	// socket gets back. It runs after Handler.OnConnect accepted the socket
	// (and only for the session's owner), before the CONNECT reply, so it
	// may ask an outside service: it holds up this socket only. The rooms
	// it leaves out are left as if the client had left them, and nothing
	// broadcast to them is replayed. What it emits reaches the client after
	// the CONNECT reply and the replay.
	Admit func(ctx context.Context, s *Socket, rooms []string) []string
	// Now is the clock of the history and of the memory store (tests).
	Now func() time.Time
}

func (r RecoveryConfig) withDefaults(sendQueue int) RecoveryConfig {
	r.MaxPackets = cmp.Or(r.MaxPackets, DefaultRecoveryMaxPackets)
	r.MaxPackets = max(1, min(r.MaxPackets, sendQueue-16))
	r.MaxBytes = cmp.Or(r.MaxBytes, DefaultRecoveryMaxBytes)
	r.HistoryBytes = cmp.Or(r.HistoryBytes, DefaultRecoveryHistoryBytes)
	if r.Now == nil {
		r.Now = time.Now
	}
	if r.Store == nil && r.Window > 0 {
		r.Store = NewMemoryStore(r.Now)
	}
	return r
}

// Session is what is kept of a disconnected socket.
type Session struct {
	PID   string   // private session id, known to the client only
	SID   string   // the socket id
	Rooms []string // joined rooms, not the own room
	Owner string   // RecoveryConfig.Owner of the socket
}

// SessionStore keeps the sessions of disconnected sockets.
type SessionStore interface {
	// Save keeps s for ttl (replacing a session of the same PID).
	Save(ctx context.Context, s Session, ttl time.Duration) error
	// Take removes and returns the session of pid, if it is kept and has not
	// expired.
	Take(ctx context.Context, pid string) (Session, bool, error)
}

// MemoryStore is a SessionStore in this process's memory.
type MemoryStore struct {
	now func() time.Time

	mu        sync.Mutex
	m         map[string]memSession
	nextPurge time.Time
}

type memSession struct {
	s       Session
	expires time.Time
}

// NewMemoryStore returns an empty store on clock now (nil: time.Now).
func NewMemoryStore(now func() time.Time) *MemoryStore {
	if now == nil {
		now = time.Now
	}
	return &MemoryStore{now: now, m: map[string]memSession{}}
}

// Save implements SessionStore; expired sessions are dropped as it goes.
func (m *MemoryStore) Save(_ context.Context, s Session, ttl time.Duration) error {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if now.After(m.nextPurge) {
		for pid, ms := range m.m {
			if !now.Before(ms.expires) {
				delete(m.m, pid)
			}
		}
		m.nextPurge = now.Add(min(ttl, 10*time.Second))
	}
	m.m[s.PID] = memSession{s: s, expires: now.Add(ttl)}
	return nil
}

// Take implements SessionStore.
func (m *MemoryStore) Take(_ context.Context, pid string) (Session, bool, error) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	ms, ok := m.m[pid]
	delete(m.m, pid)
	if !ok || !now.Before(ms.expires) {
		return Session{}, false, nil
	}
	return ms.s, true, nil
}

// Len is the number of kept sessions, expired ones not yet dropped included.
func (m *MemoryStore) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.m)
}

// history is a namespace's recorded broadcasts, oldest first, bounded by the
// window and HistoryBytes. Its lock also orders recorded broadcasts with
// restores: a broadcast records and queues to the room's members under it,
// a restore collects what follows the offset and joins the rooms under it,
// so every recorded packet reaches a recovering socket exactly once and in
// order.
type history struct {
	mu      sync.Mutex
	entries []histEntry
	first   uint64            // number of entries[0]
	index   map[string]uint64 // offset -> entry number
	bytes   int64
}

// histEntryOverhead is what an entry costs besides its packet's bytes (the
// entry, its message, its index key), counted against HistoryBytes.
const histEntryOverhead = 160

type histEntry struct {
	offset string
	room   string
	msg    *engineio.Message
	size   int64
	at     time.Time
}

// addLocked records a broadcast and drops what is past the bounds.
func (h *history) addLocked(e histEntry, rc *RecoveryConfig) {
	if h.index == nil {
		h.index = map[string]uint64{}
	}
	if _, dup := h.index[e.offset]; dup {
		return
	}
	h.index[e.offset] = h.first + uint64(len(h.entries))
	h.entries = append(h.entries, e)
	h.bytes += e.size + histEntryOverhead
	h.trimLocked(e.at, rc)
}

func (h *history) trimLocked(now time.Time, rc *RecoveryConfig) {
	cut := now.Add(-rc.Window)
	n := 0
	for n < len(h.entries) && (h.entries[n].at.Before(cut) || h.bytes > rc.HistoryBytes) {
		h.bytes -= h.entries[n].size + histEntryOverhead
		delete(h.index, h.entries[n].offset)
		h.entries[n] = histEntry{}
		n++
	}
	if n > 0 {
		h.first += uint64(n)
		h.entries = h.entries[n:]
		if cap(h.entries) > 64 && len(h.entries) < cap(h.entries)/4 {
			h.entries = append(make([]histEntry, 0, len(h.entries)*2), h.entries...)
		}
	}
}

// sinceLocked returns the recorded packets of rooms that follow offset, or
// false when offset is not held or they exceed the bounds.
func (h *history) sinceLocked(offset string, rooms []string, rc *RecoveryConfig) ([]*engineio.Message, bool) {
	h.trimLocked(rc.Now(), rc)
	num, ok := h.index[offset]
	if !ok {
		return nil, false
	}
	in := make(map[string]struct{}, len(rooms))
	for _, r := range rooms {
		in[r] = struct{}{}
	}
	var out []*engineio.Message
	var size int64
	for _, e := range h.entries[num-h.first+1:] {
		if _, ok := in[e.room]; !ok {
			continue
		}
		size += e.size
		if len(out) >= rc.MaxPackets || size > rc.MaxBytes {
			return nil, false
		}
		out = append(out, e.msg)
	}
	return out, true
}

// recoveryAuth reads pid and offset from a CONNECT auth payload.
func recoveryAuth(auth json.RawMessage) (pid, offset string) {
	if len(auth) == 0 {
		return "", ""
	}
	var a struct {
		PID    any `json:"pid"`
		Offset any `json:"offset"`
	}
	if json.Unmarshal(auth, &a) != nil {
		return "", ""
	}
	pid, _ = a.PID.(string)
	offset, _ = a.Offset.(string)
	return pid, offset
}

// recoverable reports whether the client recovers after a close for reason:
// it reconnects by itself and did not mean to leave.
func recoverable(reason string) bool {
	switch reason {
	case ReasonTransportClose, ReasonTransportError, ReasonPingTimeout, ReasonSlowConsumer, ReasonServerShutdown:
		return true
	}
	return false
}

// EmitToAt is EmitTo for a broadcast that clients may recover: with recovery
// enabled and a non-empty offset, the offset is sent as the event's last
// argument and the packet is recorded under it for Window, to be replayed to
// a member of room that recovers its session with an earlier offset.
// Offsets should be unique; a broadcast whose offset is already recorded is
// sent without one and not recorded. Recorded broadcasts of a namespace are queued one at a
// time, in the order they are recorded.
func (n *Namespace) EmitToAt(room, offset, event string, args ...any) error {
	rc := &n.srv.rc
	if rc.Window <= 0 || offset == "" {
		return n.EmitTo(room, event, args...)
	}
	m, size, err := encodeEventSize(n.name, event, append(args[:len(args):len(args)], offset), 0, false)
	if err != nil {
		return err
	}
	var plain *engineio.Message // for members that take no offsets, built on demand
	h := &n.hist
	h.mu.Lock()
	if _, dup := h.index[offset]; dup {
		// Not recorded twice: sent without an offset, like an event no
		// client can recover.
		h.mu.Unlock()
		return n.EmitTo(room, event, args...)
	}
	h.addLocked(histEntry{offset: offset, room: room, msg: m, size: int64(size), at: rc.Now()}, rc)
	members := n.rooms.snapshot(room)
	for _, sock := range *members {
		if !sock.offsets.Load() {
			if plain == nil {
				if plain, err = encodeEvent(n.name, event, args, 0, false); err != nil {
					break
				}
			}
			_ = sock.queue(plain)
			continue
		}
		if sock.queue(m) == nil {
			sock.gotOffset.Store(true)
		}
	}
	h.mu.Unlock()
	for _, sock := range *members {
		sock.c.conn.Flush()
	}
	n.rooms.release(members)
	return err
}

// ResetHistory forgets every recorded broadcast: no session recovers from an
// offset recorded before (the embedding server calls it when it knows it
// missed broadcasts, so replays would have holes).
func (n *Namespace) ResetHistory() {
	n.hist.mu.Lock()
	defer n.hist.mu.Unlock()
	clear(n.hist.entries)
	n.hist.first += uint64(len(n.hist.entries))
	n.hist.entries = nil
	n.hist.index = nil
	n.hist.bytes = 0
}

// TrimHistory drops the recorded broadcasts past the window or the bounds
// now (recording does it too; call it on a timer so that an idle namespace
// lets go of them).
func (n *Namespace) TrimHistory() {
	rc := &n.srv.rc
	if rc.Window <= 0 {
		return
	}
	n.hist.mu.Lock()
	defer n.hist.mu.Unlock()
	n.hist.trimLocked(rc.Now(), rc)
	if len(n.hist.entries) == 0 {
		n.hist.entries, n.hist.index = nil, nil
	}
}

// HistoryLen is the number of recorded broadcasts the namespace holds.
func (n *Namespace) HistoryLen() int {
	n.hist.mu.Lock()
	defer n.hist.mu.Unlock()
	return len(n.hist.entries)
}

// Recovered reports whether the socket's session was recovered: it has the
// id and rooms of a socket that went away and got what it missed.
func (s *Socket) Recovered() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.recovered
}

// saveSession keeps the session of a socket that went away for reason, if
// the client may recover it. Called before the socket leaves its rooms.
func (c *client) saveSession(sock *Socket, reason string) {
	rc := &c.srv.rc
	if rc.Window <= 0 || !recoverable(reason) || !sock.gotOffset.Load() {
		return
	}
	sock.mu.Lock()
	if !sock.accepted || sock.pid == "" {
		sock.mu.Unlock()
		return
	}
	sess := Session{PID: sock.pid, SID: sock.id, Rooms: make([]string, 0, len(sock.rooms))}
	for r := range sock.rooms {
		if rc.KeepRoom == nil || rc.KeepRoom(r) {
			sess.Rooms = append(sess.Rooms, r)
		}
	}
	sock.mu.Unlock()
	if rc.Owner != nil {
		sess.Owner = rc.Owner(sock)
	}
	c.srv.tr.add()
	go func() {
		defer c.srv.tr.done()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := rc.Store.Save(ctx, sess, rc.Window); err != nil {
			c.srv.cfg.Logger.Warn("sio: save session for recovery", "err", err)
		}
	}()
}

// takeSession looks up the session a CONNECT asks to recover (before
// Handler.OnConnect runs).
func (c *client) takeSession(sock *Socket, auth json.RawMessage) {
	rc := &c.srv.rc
	if rc.Window <= 0 {
		return
	}
	pid, offset := recoveryAuth(auth)
	recovering := pid != "" && offset != ""
	sock.offsets.Store(recovering || rc.Wants == nil || rc.Wants(auth))
	if !recovering {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	sess, ok, err := rc.Store.Take(ctx, pid)
	if err != nil {
		c.srv.cfg.Logger.Warn("sio: look up session to recover", "err", err)
		return
	}
	if ok {
		sock.mu.Lock()
		sock.restore = &pendingRestore{sess: sess, offset: offset}
		sock.mu.Unlock()
	}
}

// admitSession runs RecoveryConfig.Admit on the rooms of the session a
// socket accepted by Handler.OnConnect asks to recover. A session of another
// owner is dropped first: nothing of it is asked about.
func (c *client) admitSession(sock *Socket) {
	rc := &c.srv.rc
	sock.mu.Lock()
	pr := sock.restore
	sock.mu.Unlock()
	if pr == nil {
		return
	}
	if rc.Owner != nil && rc.Owner(sock) != pr.sess.Owner {
		sock.mu.Lock()
		sock.restore = nil
		sock.mu.Unlock()
		return
	}
	if rc.Admit == nil || len(pr.sess.Rooms) == 0 {
		return
	}
	kept := rc.Admit(sock.ctx, sock, slices.Clone(pr.sess.Rooms))
	sock.mu.Lock()
	pr.sess.Rooms = kept
	sock.mu.Unlock()
}

// pendingRestore is a session a connecting socket asked to recover.
type pendingRestore struct {
	sess   Session
	offset string
}
