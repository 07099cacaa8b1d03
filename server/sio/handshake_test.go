package sio

import (
	"net/http/httptest"
	"testing"

	"github.com/zndraw/joblib/internal/clientaddr"
)

// OnConnect's request keeps the client address of the handshake (behind a
// trusted proxy: the client, not the proxy), though not its context.
func TestHandshakeKeepsClientAddr(t *testing.T) {
	t.Parallel()
	r := httptest.NewRequest("GET", "/socket.io/?EIO=4&transport=polling", nil)
	r.RemoteAddr = "10.0.0.1:4000"
	r = r.WithContext(clientaddr.NewContext(r.Context(), "198.51.100.1"))
	if got := clientaddr.Of(keepHandshake(r, nil).request()); got != "198.51.100.1" {
		t.Fatalf("client address in OnConnect: %q", got)
	}
}
