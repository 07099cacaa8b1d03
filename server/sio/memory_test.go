package sio

import (
	"context"
	"runtime"
	"testing"
)

// TestMemoryPerPollingSession opens 2000 polling sessions in memory (no
// network), each connected to "/" and in one room, and reports the heap
// they hold. An idle polling client also holds one pending GET, whose cost
// (an HTTP connection) belongs to net/http and is not counted here; the
// websocket figures come from bench/fanout.
func TestMemoryPerPollingSession(t *testing.T) {
	srv := New(Config{MaxSessionsPerAddr: 1 << 20}, roomHandler{})
	defer srv.Shutdown(context.Background())
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	const n = 2000
	before := heap()
	sids := make([]string, n)
	for i := range sids {
		sids[i] = memPolling(t, srv)
	}
	eventually(t, ioTimeout, "all sockets in the room", func() bool { return srv.RoomSize("room") == n })
	drainPolling(srv, sids) // the CONNECT replies
	per := (float64(heap()) - float64(before)) / n
	t.Logf("%.0f bytes of heap per connected polling session", per)
	if per > 6<<10 {
		t.Fatalf("%.0f bytes per polling session", per)
	}
}
