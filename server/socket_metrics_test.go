package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
	"github.com/zndraw/joblib/server/sio"
)

// Closed sockets are counted by reason (joblib_socket_disconnects_total),
// the series the slow-consumer alert reads.
func TestSocketDisconnectsCountedByReason(t *testing.T) {
	t.Parallel()
	e := setup(t, dbtest.Open(t, models.SQLite), withRealtime(realtimeCfg()))
	reg := prometheus.NewRegistry()
	reg.MustRegister(server.SocketCollector(e.rt))
	c := mustDialSIO(t, e.url, e.bob)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.cl.Disconnect(ctx); err != nil { // socket.disconnect()
		t.Fatal(err)
	}
	want := `
# HELP joblib_socket_disconnects_total Closed Socket.IO connections on this node by reason (slow consumer, ping timeout, transport error, ...).
# TYPE joblib_socket_disconnects_total counter
joblib_socket_disconnects_total{reason="` + sio.ReasonClientNamespaceDisconnect + `"} 1
`
	waitFor(t, 5*time.Second, func() bool {
		return testutil.GatherAndCompare(reg, stringsReader(want), "joblib_socket_disconnects_total") == nil
	})
}
