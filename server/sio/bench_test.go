package sio

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
)

type nopHandler struct{}

func (nopHandler) OnConnect(context.Context, *Socket, *http.Request, json.RawMessage) error {
	return nil
}
func (nopHandler) OnEvent(context.Context, *Socket, Event, AckFunc) {}
func (nopHandler) OnDisconnect(*Socket, string)                     {}

// memSocket attaches a connected socket to an in-memory session whose "writer"
// only drains the queue, so the benchmark measures the server's fan-out path
// (encode once, snapshot, enqueue) and nothing of the network.
func memSocket(srv *Server, room string, drained *atomic.Int64, stop <-chan struct{}, wg *sync.WaitGroup) *Socket {
	r := httptest.NewRequest(http.MethodGet, "/socket.io/?EIO=4&transport=websocket", nil)
	s := newSession(srv, r, transportWebSocket)
	sock := newSocket(s)
	s.sock, s.ns = sock, nsConnected
	sock.state, sock.accepted = sockConnected, true
	sock.Join(room)
	wg.Add(1)
	go func() {
		defer wg.Done()
		var batch []outMsg
		for {
			select {
			case <-s.q.wake:
				batch = s.q.take(batch)
				drained.Add(int64(len(batch)))
			case <-stop:
				return
			}
		}
	}()
	return sock
}

// BenchmarkEmitTo broadcasts one small JSON event to a room of 1000 sockets.
//
//	go test -run '^$' -bench EmitTo -benchmem ./server/sio/
func BenchmarkEmitTo(b *testing.B) {
	const sockets = 1000
	srv := New(Config{SendQueue: 1 << 20}, nopHandler{})
	var drained atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range sockets {
		memSocket(srv, "room", &drained, stop, &wg)
	}
	payload := map[string]any{"id": "4f1c2d", "status": "running", "room_id": "room-1", "queue_position": 3}
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		if err := srv.EmitTo("room", "task_status_event", payload); err != nil {
			b.Fatal(err)
		}
		n++
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n*sockets), "ns/delivery")
	close(stop)
	wg.Wait()
	if srv.NumSockets() != 0 || srv.RoomSize("room") != sockets {
		b.Fatalf("sockets were closed during the benchmark: room has %d", srv.RoomSize("room"))
	}
}
