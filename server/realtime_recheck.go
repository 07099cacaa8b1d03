package server

// The credential and room re-check: sockets whose credential or room
// grant lapsed are disconnected or taken out of the room.

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/server/sio"
)

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
		ctx, cancel := rt.readBudget(rt.ctx)
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
		err := rt.rooms.checkHeld(rt.ctx, st.p, st.token, g.room, g.access, roomAge)
		reason := refusal(err)
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
			rt.log.Info("socket left a room the host no longer grants", "socket", s.ID(), "user", st.p.Name, "room", g.room, "reason", reason, "err", err)
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
// for it after its CONNECT; a room it cannot answer for is refused too,
// unless room auth fails open or this node holds an allowing answer younger
// than the outage grace (RoomAuthConfig.OutageGrace).
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
		if err := rt.rooms.checkHeld(ctx, st.p, st.token, id, accessRead, roomAge); err != nil {
			reason := cmp.Or(refusal(err), leftUnavailable)
			rt.log.Info("recovered socket not given back a room", "socket", s.ID(), "user", st.p.Name, "room", id, "reason", reason, "err", err)
			_ = s.Emit(roomLeftEvent, roomLeft(g, reason))
			continue
		}
		st.gate(sioRoom, g)
		kept = append(kept, sioRoom)
	}
	return kept
}
