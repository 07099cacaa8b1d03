package sio

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeClock is the injected clock of the recovery window.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

type connectReply struct {
	SID string `json:"sid"`
	PID string `json:"pid"`
}

func readConnect(t *testing.T, pkt string) connectReply {
	t.Helper()
	if !strings.HasPrefix(pkt, "40{") {
		t.Fatalf("want CONNECT reply, got %q", pkt)
	}
	var r connectReply
	if err := json.Unmarshal([]byte(pkt[2:]), &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// recoveryServer runs a server with recovery on the fake clock; its sockets
// join room "r" with the event "join".
func recoveryServer(t *testing.T, rc RecoveryConfig) (*testServer, *fakeClock, *MemoryStore) {
	t.Helper()
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	store := NewMemoryStore(clock.Now)
	rc.Now, rc.Store = clock.Now, store
	ts := startServer(t, Config{Recovery: rc, PingInterval: time.Hour, PingTimeout: time.Hour}, nil)
	return ts, clock, store
}

// joinRoom connects a websocket client (with auth, if any), joins "r" and
// returns the client and its CONNECT reply.
func joinRoom(t *testing.T, ts *testServer, auth string) (*wsClient, connectReply) {
	t.Helper()
	w, _ := openWS(t, ts)
	w.send("40" + auth)
	r := readConnect(t, w.next())
	w.send(`421["join","r"]`)
	if got := nextPacket(w); got != `431["joined"]` {
		t.Fatalf("join ack = %q", got)
	}
	return w, r
}

func emitAt(t *testing.T, ts *testServer, from, to int) {
	t.Helper()
	for i := from; i <= to; i++ {
		if err := ts.srv.EmitToAt("r", fmt.Sprintf("o%d", i), "ev", map[string]int{"n": i}); err != nil {
			t.Fatal(err)
		}
	}
}

// nextPacket is the next packet that is not the test handler's "auth" echo
// (sent after the CONNECT reply and any replay).
func nextPacket(w *wsClient) string {
	w.t.Helper()
	for {
		if p := w.next(); !strings.HasPrefix(p, `42["auth",`) {
			return p
		}
	}
}

func wantEvent(t *testing.T, w *wsClient, n int) {
	t.Helper()
	want := fmt.Sprintf(`42["ev",{"n":%d},"o%d"]`, n, n)
	if got := nextPacket(w); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// dropped closes the client's websocket and waits until the server has kept
// its session.
func dropped(t *testing.T, w *wsClient, store *MemoryStore) {
	t.Helper()
	_ = w.c.CloseNow()
	eventually(t, 5*time.Second, "the session kept", func() bool { return store.Len() == 1 })
}

func TestRecoveryReplaysMissedPacketsInOrder(t *testing.T) {
	t.Parallel()
	ts, _, store := recoveryServer(t, RecoveryConfig{Window: time.Minute})
	var last *Socket
	ts.h.mu.Lock()
	ts.h.onConnect = func(s *Socket) error { last = s; return nil }
	ts.h.mu.Unlock()
	w, first := joinRoom(t, ts, "")
	if first.PID == "" || first.PID == first.SID {
		t.Fatalf("CONNECT reply %+v: want a private session id", first)
	}
	emitAt(t, ts, 1, 2)
	wantEvent(t, w, 1)
	wantEvent(t, w, 2)
	// Direct emits and hints carry no offset and are not recorded.
	if err := ts.srv.EmitTo("r", "plain", 1); err != nil {
		t.Fatal(err)
	}
	if got := nextPacket(w); got != `42["plain",1]` {
		t.Fatalf("plain broadcast = %q", got)
	}
	dropped(t, w, store)
	emitAt(t, ts, 3, 5)

	w2, _ := openWS(t, ts)
	w2.send(`40{"pid":"` + first.PID + `","offset":"o2","token":"x"}`)
	r := readConnect(t, w2.next())
	if r != first {
		t.Fatalf("recovered CONNECT reply %+v, want %+v", r, first)
	}
	for n := 3; n <= 5; n++ {
		wantEvent(t, w2, n)
	}
	// The room was restored: live broadcasts follow, once.
	emitAt(t, ts, 6, 6)
	wantEvent(t, w2, 6)
	if last == nil || last.ID() != first.SID || !last.Recovered() {
		t.Fatal("the socket does not report Recovered")
	}
	// A session is recovered once.
	w3, _ := openWS(t, ts)
	w3.send(`40{"pid":"` + first.PID + `","offset":"o2"}`)
	if r3 := readConnect(t, w3.next()); r3.SID == first.SID || r3.PID == first.PID {
		t.Fatalf("second recovery of one session = %+v", r3)
	}
}

func TestRecoveryFreshSession(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		rc     RecoveryConfig
		missed int           // broadcasts while away (o3...)
		away   time.Duration // on the fake clock
		offset string
	}{
		{"within the bounds", RecoveryConfig{Window: time.Minute, MaxPackets: 3}, 3, 0, "o2"},
		{"more packets than MaxPackets", RecoveryConfig{Window: time.Minute, MaxPackets: 3}, 4, 0, "o2"},
		{"more bytes than MaxBytes", RecoveryConfig{Window: time.Minute, MaxBytes: 3 * 24}, 4, 0, "o2"},
		{"past the window", RecoveryConfig{Window: time.Minute}, 1, time.Minute + time.Second, "o2"},
		{"just within the window", RecoveryConfig{Window: time.Minute}, 1, time.Minute - time.Second, "o2"},
		{"an offset never sent", RecoveryConfig{Window: time.Minute}, 1, 0, "nope"},
		{"history bytes bound dropped the offset", RecoveryConfig{Window: time.Minute, HistoryBytes: 4 * (20 + histEntryOverhead)}, 5, 0, "o2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ts, clock, store := recoveryServer(t, tc.rc)
			w, first := joinRoom(t, ts, "")
			emitAt(t, ts, 1, 2)
			wantEvent(t, w, 1)
			wantEvent(t, w, 2)
			dropped(t, w, store)
			emitAt(t, ts, 3, 2+tc.missed)
			clock.advance(tc.away)

			w2, _ := openWS(t, ts)
			w2.send(`40{"pid":"` + first.PID + `","offset":"` + tc.offset + `"}`)
			r := readConnect(t, w2.next())
			recovered := r == first
			want := tc.name == "within the bounds" || tc.name == "just within the window"
			if recovered != want {
				t.Fatalf("recovered = %v (reply %+v, first %+v), want %v", recovered, r, first, want)
			}
			if !recovered {
				if r.PID == "" || r.PID == first.PID || r.SID == first.SID {
					t.Fatalf("fresh session reply %+v", r)
				}
				// Nothing is replayed and the old rooms are not restored.
				emitAt(t, ts, 100, 100)
				w2.send(`421["echo","after"]`)
				if got := nextPacket(w2); got != `431["after"]` {
					t.Fatalf("fresh session got %q", got)
				}
				return
			}
			for n := 3; n <= 2+tc.missed; n++ {
				wantEvent(t, w2, n)
			}
		})
	}
}

// ownedBy makes OnConnect give each socket *user (read under mu) as its data;
// dataOwner names it.
func ownedBy(ts *testServer, mu *sync.Mutex, user *string) {
	ts.h.mu.Lock()
	defer ts.h.mu.Unlock()
	ts.h.onConnect = func(s *Socket) error {
		mu.Lock()
		defer mu.Unlock()
		s.SetData(*user)
		return nil
	}
}

func dataOwner(s *Socket) string { v, _ := s.Data().(string); return v }

// TestRecoveryOwner: a session is restored only to the socket's owner.
func TestRecoveryOwner(t *testing.T) {
	t.Parallel()
	ts, _, store := recoveryServer(t, RecoveryConfig{Window: time.Minute, Owner: dataOwner})
	var mu sync.Mutex
	user := "alice"
	ownedBy(ts, &mu, &user)
	w, first := joinRoom(t, ts, "")
	emitAt(t, ts, 1, 1)
	wantEvent(t, w, 1)
	dropped(t, w, store)
	emitAt(t, ts, 2, 2)
	w2, _ := openWS(t, ts)
	mu.Lock()
	user = "mallory"
	mu.Unlock()
	w2.send(`40{"pid":"` + first.PID + `","offset":"o1"}`)
	if r := readConnect(t, w2.next()); r == first {
		t.Fatal("another owner recovered the session")
	}
}

// TestRecoveryConcurrentBroadcasts: broadcasts racing a recovery reach the
// recovered socket exactly once, in the order they were recorded.
func TestRecoveryConcurrentBroadcasts(t *testing.T) {
	t.Parallel()
	ts, _, store := recoveryServer(t, RecoveryConfig{Window: time.Minute})
	w, first := joinRoom(t, ts, "")
	emitAt(t, ts, 1, 1)
	wantEvent(t, w, 1)
	dropped(t, w, store)
	const total = 300
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 2; i <= total; i++ {
			_ = ts.srv.EmitToAt("r", fmt.Sprintf("o%d", i), "ev", map[string]int{"n": i})
		}
	}()
	w2, _ := openWS(t, ts)
	w2.send(`40{"pid":"` + first.PID + `","offset":"o1"}`)
	if r := readConnect(t, w2.next()); r != first {
		t.Fatalf("not recovered: %+v", r)
	}
	<-done
	for n := 2; n <= total; n++ {
		wantEvent(t, w2, n)
	}
}

// TestRecoveryOptIn: with Wants set, a client that did not ask for offsets
// gets the recorded broadcasts without one (a fixed-arity handler keeps
// working) and is never recovered; one that asked gets them.
func TestRecoveryOptIn(t *testing.T) {
	t.Parallel()
	ts, _, _ := recoveryServer(t, RecoveryConfig{Window: time.Minute, Wants: func(auth json.RawMessage) bool {
		return strings.Contains(string(auth), `"recover":true`)
	}})
	plain, _ := joinRoom(t, ts, "")
	wants, _ := joinRoom(t, ts, `{"recover":true}`)
	emitAt(t, ts, 1, 1)
	if got := nextPacket(plain); got != `42["ev",{"n":1}]` {
		t.Fatalf("a client without offsets got %q", got)
	}
	wantEvent(t, wants, 1)
}

// droppedFromTwoRooms connects a client to rooms "r" and "other", lets it
// take broadcast o1 and drops it; it returns its CONNECT reply.
func droppedFromTwoRooms(t *testing.T, ts *testServer, store *MemoryStore) connectReply {
	t.Helper()
	w, first := joinRoom(t, ts, "")
	w.send(`421["join","other"]`)
	if got := nextPacket(w); got != `431["joined"]` {
		t.Fatalf("join ack = %q", got)
	}
	emitAt(t, ts, 1, 1)
	wantEvent(t, w, 1)
	dropped(t, w, store)
	return first
}

// TestRecoveryKeepRoom: a recovered socket gets back only the rooms KeepRoom
// keeps.
func TestRecoveryKeepRoom(t *testing.T) {
	t.Parallel()
	ts, _, store := recoveryServer(t, RecoveryConfig{Window: time.Minute, KeepRoom: func(r string) bool { return r == "r" }})
	first := droppedFromTwoRooms(t, ts, store)
	w2, _ := openWS(t, ts)
	w2.send(`40{"pid":"` + first.PID + `","offset":"o1"}`)
	if r := readConnect(t, w2.next()); r != first {
		t.Fatalf("not recovered: %+v", r)
	}
	if err := ts.srv.EmitToAt("other", "x1", "ev", map[string]int{"n": 0}); err != nil {
		t.Fatal(err)
	}
	emitAt(t, ts, 2, 2)
	wantEvent(t, w2, 2) // not the broadcast to "other"
}

// TestRecoveryHistoryTrimmedWhenIdle: recorded broadcasts past the window go
// on TrimHistory, without a new broadcast.
func TestRecoveryHistoryTrimmedWhenIdle(t *testing.T) {
	t.Parallel()
	ts, clock, _ := recoveryServer(t, RecoveryConfig{Window: time.Minute})
	emitAt(t, ts, 1, 3)
	ns := ts.srv.Namespace("/")
	clock.advance(30 * time.Second)
	ns.TrimHistory()
	if n := ns.HistoryLen(); n != 3 {
		t.Fatalf("within the window: %d recorded, want 3", n)
	}
	clock.advance(31 * time.Second)
	ns.TrimHistory()
	if n := ns.HistoryLen(); n != 0 {
		t.Fatalf("past the window: %d recorded, want 0", n)
	}
}

// TestRecoveryAdmit: a recovering socket gets back only the rooms Admit
// admits, asked after OnConnect and only for the session's owner; what was
// broadcast meanwhile to a room it lost is not replayed, and what Admit
// emits arrives after the CONNECT reply.
func TestRecoveryAdmit(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var asked [][]string
	user := "alice"
	admit := func(_ context.Context, s *Socket, rooms []string) []string {
		mu.Lock()
		asked = append(asked, slices.Clone(rooms))
		mu.Unlock()
		if dataOwner(s) == "" {
			t.Error("Admit ran before OnConnect set the socket's data")
		}
		var kept []string
		for _, r := range rooms {
			if r == "r" {
				_ = s.Emit("left", r)
				continue
			}
			kept = append(kept, r)
		}
		return kept
	}
	ts, _, store := recoveryServer(t, RecoveryConfig{Window: time.Minute, Owner: dataOwner, Admit: admit})
	ownedBy(ts, &mu, &user)
	first := droppedFromTwoRooms(t, ts, store)
	emitAt(t, ts, 2, 2) // to "r", which the socket does not get back
	if err := ts.srv.EmitToAt("other", "x1", "ev", map[string]int{"n": 0}); err != nil {
		t.Fatal(err)
	}
	w2, _ := openWS(t, ts)
	w2.send(`40{"pid":"` + first.PID + `","offset":"o1"}`)
	if r := readConnect(t, w2.next()); r != first {
		t.Fatalf("not recovered: %+v", r)
	}
	if got := nextPacket(w2); got != `42["ev",{"n":0},"x1"]` {
		t.Fatalf("replay: got %q, want only the broadcast to the admitted room", got)
	}
	if got := nextPacket(w2); got != `42["left","r"]` {
		t.Fatalf("got %q, want Admit's event after the replay", got)
	}
	emitAt(t, ts, 3, 3)
	if err := ts.srv.EmitToAt("other", "x2", "ev", map[string]int{"n": -1}); err != nil {
		t.Fatal(err)
	}
	if got := nextPacket(w2); got != `42["ev",{"n":-1},"x2"]` {
		t.Fatalf("got %q: the socket is still in the room Admit left out", got)
	}
	mu.Lock()
	if len(asked) != 1 || !slices.Equal(sorted(asked[0]...), sorted("other", "r")) {
		t.Fatalf("Admit asked about %v", asked)
	}
	mu.Unlock()

	// Another owner's attempt is never asked about.
	w3, third := joinRoom(t, ts, "")
	emitAt(t, ts, 4, 4)
	wantEvent(t, w3, 4)
	dropped(t, w3, store)
	mu.Lock()
	user = "mallory"
	mu.Unlock()
	w4, _ := openWS(t, ts)
	w4.send(`40{"pid":"` + third.PID + `","offset":"o4"}`)
	if r := readConnect(t, w4.next()); r == third {
		t.Fatal("another owner recovered the session")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 1 {
		t.Fatalf("Admit asked about another owner's session: %v", asked)
	}
}
