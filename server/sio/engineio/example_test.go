package engineio_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/zndraw/joblib/server/sio/engineio"
)

// echo answers every message with the same message.
type echo struct{}

func (echo) OnOpen(c *engineio.Conn, r *http.Request) error { return nil }

func (echo) OnMessage(c *engineio.Conn, data []byte, binary bool) {
	if binary {
		_ = c.Send(engineio.NewBinaryMessage(data))
		return
	}
	_ = c.Send(engineio.NewMessage(data))
}

func (echo) OnClose(c *engineio.Conn, reason string) {}

// An echo server, spoken to over HTTP long-polling.
func Example() {
	srv := engineio.NewServer(engineio.Config{}, echo{})
	defer srv.Shutdown(context.Background())

	// Handshake: "0" and the open packet.
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, httptest.NewRequest("GET", "/engine.io/?EIO=4&transport=polling", nil))
	open := rec.Body.String()
	sid := open[strings.Index(open, `"sid":"`)+7:]
	sid = sid[:strings.IndexByte(sid, '"')]

	// Send a text message ("4hello") and a binary one, read both back.
	url := "/engine.io/?EIO=4&transport=polling&sid=" + sid
	srv.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", url, strings.NewReader("4hello\x1ebAQI=")))
	rec = httptest.NewRecorder()
	srv.ServeHTTP(rec, httptest.NewRequest("GET", url, nil))
	fmt.Printf("%q\n", rec.Body.String())
	// Output: "4hello\x1ebAQI="
}
