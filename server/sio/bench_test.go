package sio

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

type nopHandler struct{}

func (nopHandler) OnConnect(context.Context, *Socket, *http.Request, json.RawMessage) error {
	return nil
}
func (nopHandler) OnEvent(context.Context, *Socket, Event, AckFunc) {}
func (nopHandler) OnDisconnect(*Socket, string)                     {}

// roomHandler joins every socket to "room".
type roomHandler struct{ nopHandler }

func (roomHandler) OnConnect(_ context.Context, s *Socket, _ *http.Request, _ json.RawMessage) error {
	return s.Join("room")
}

// memPolling opens a polling session through ServeHTTP in memory and
// connects it to "/"; it returns the session id.
func memPolling(tb testing.TB, srv *Server) string {
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/socket.io/?EIO=4&transport=polling", nil))
	var open struct{ SID string }
	if err := json.Unmarshal([]byte(strings.TrimPrefix(rec.Body.String(), "0")), &open); err != nil {
		tb.Fatalf("handshake %q: %v", rec.Body.String(), err)
	}
	rec = httptest.NewRecorder()
	srv.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/socket.io/?EIO=4&transport=polling&sid="+open.SID, strings.NewReader("40")))
	if rec.Code != 200 {
		tb.Fatalf("connect: %d %s", rec.Code, rec.Body.String())
	}
	return open.SID
}

// drainPolling answers one GET of every session (the queues are not empty).
func drainPolling(srv *Server, sids []string) {
	for _, sid := range sids {
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/socket.io/?EIO=4&transport=polling&sid="+sid, nil))
	}
}

// BenchmarkEmitTo broadcasts one small JSON event to a room of 1000
// sockets held by in-memory polling sessions, so that it measures the
// server's fan-out path (encode once, snapshot, enqueue) and nothing of the
// network.
//
//	go test -run '^$' -bench EmitTo -benchmem ./server/sio/
func BenchmarkEmitTo(b *testing.B) {
	const sockets = 1000
	srv := New(Config{SendQueue: 1 << 20, MaxSessionsPerAddr: 1 << 20}, roomHandler{})
	defer srv.Shutdown(context.Background())
	sids := make([]string, sockets)
	for i := range sids {
		sids[i] = memPolling(b, srv)
	}
	for srv.RoomSize("room") != sockets {
		drainPolling(srv, sids[:1])
	}
	payload := map[string]any{"id": "4f1c2d", "status": "running", "room_id": "room-1", "queue_position": 3}
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		if err := srv.EmitTo("room", "task_status_event", payload); err != nil {
			b.Fatal(err)
		}
		n++
		if n%512 == 0 {
			b.StopTimer()
			drainPolling(srv, sids)
			b.StartTimer()
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n*sockets), "ns/delivery")
	if srv.NumSockets() != sockets || srv.RoomSize("room") != sockets {
		b.Fatalf("sockets were closed during the benchmark: room has %d", srv.RoomSize("room"))
	}
}
