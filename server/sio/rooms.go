package sio

import "sync"

// roomTable maps room names to member sockets. Broadcasts take a snapshot under
// the read lock and enqueue outside it, so a membership change never waits for a
// broadcast and a broadcast never waits for a socket.
//
// A socket's own room (named by its id) is kept apart, in own: one map entry
// per socket instead of a room of one.
type roomTable struct {
	mu  sync.RWMutex
	m   map[string]map[*Socket]struct{}
	own map[string]*Socket
}

func (t *roomTable) joinOwn(s *Socket) {
	t.mu.Lock()
	if t.own == nil {
		t.own = make(map[string]*Socket)
	}
	t.own[s.id] = s
	t.mu.Unlock()
}

func (t *roomTable) leaveOwn(s *Socket) {
	t.mu.Lock()
	if t.own[s.id] == s {
		delete(t.own, s.id)
	}
	t.mu.Unlock()
}

var snapshotPool = sync.Pool{New: func() any { s := make([]*Socket, 0, 64); return &s }}

func (t *roomTable) join(room string, s *Socket) {
	t.mu.Lock()
	defer t.mu.Unlock()
	members := t.m[room]
	if members == nil {
		members = make(map[*Socket]struct{})
		t.m[room] = members
	}
	members[s] = struct{}{}
}

func (t *roomTable) leave(room string, s *Socket) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.leaveLocked(room, s)
}

func (t *roomTable) leaveLocked(room string, s *Socket) {
	members := t.m[room]
	delete(members, s)
	if len(members) == 0 {
		delete(t.m, room)
	}
}

func (t *roomTable) leaveAll(rooms map[string]struct{}, s *Socket) {
	if len(rooms) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for room := range rooms {
		t.leaveLocked(room, s)
	}
}

func (t *roomTable) size(room string) int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	n := len(t.m[room])
	if t.own[room] != nil {
		n++
	}
	return n
}

// snapshot returns the members of room in a pooled slice; give it back with release.
func (t *roomTable) snapshot(room string) *[]*Socket {
	buf := snapshotPool.Get().(*[]*Socket)
	t.mu.RLock()
	for s := range t.m[room] {
		*buf = append(*buf, s)
	}
	if s := t.own[room]; s != nil {
		*buf = append(*buf, s)
	}
	t.mu.RUnlock()
	return buf
}

func (t *roomTable) release(buf *[]*Socket) {
	clear(*buf)
	*buf = (*buf)[:0]
	snapshotPool.Put(buf)
}
