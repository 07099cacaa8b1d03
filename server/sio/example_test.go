package sio_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/zndraw/joblib/server/sio"
)

// chat serves namespace "/": it echoes "say" to the room the client names.
type chat struct{ srv *sio.Server }

func (c *chat) OnConnect(ctx context.Context, s *sio.Socket, req *http.Request, auth json.RawMessage) error {
	return s.Join("lobby")
}

func (c *chat) OnEvent(ctx context.Context, s *sio.Socket, ev sio.Event, ack sio.AckFunc) {
	if ev.Name == "say" && len(ev.Args) == 1 {
		_ = c.srv.EmitTo("lobby", "said", ev.Args[0])
		if ack != nil {
			_ = ack("ok")
		}
	}
}

func (c *chat) OnDisconnect(s *sio.Socket, reason string) {}

// admin serves namespace "/admin" with its own auth.
type admin struct{}

func (admin) OnConnect(ctx context.Context, s *sio.Socket, req *http.Request, auth json.RawMessage) error {
	var a struct{ Token string }
	if json.Unmarshal(auth, &a) != nil || a.Token != "secret" {
		return errors.New("admins only")
	}
	return nil
}

func (admin) OnEvent(ctx context.Context, s *sio.Socket, ev sio.Event, ack sio.AckFunc) {}
func (admin) OnDisconnect(s *sio.Socket, reason string)                                 {}

// A server with the main namespace and an authenticated "/admin", mounted
// at "/socket.io/".
func Example() {
	c := &chat{}
	c.srv = sio.New(sio.Config{}, c)
	c.srv.Of("/admin", admin{})

	mux := http.NewServeMux()
	mux.Handle("/socket.io/", c.srv)
	hs := &http.Server{Addr: "127.0.0.1:0", Handler: mux}
	_ = hs // hs.ListenAndServe(); on the way out: c.srv.Shutdown(ctx), then hs.Shutdown(ctx)
	_ = c.srv.Shutdown(context.Background())
}
