package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/zndraw/joblib/internal/sio/sioclient"
)

// socket is Run's Socket.IO connection (namespace "/", websocket), on the
// client the server's codec is shared with.
type socket struct {
	c    *sioclient.Client
	done <-chan struct{} // closed when the connection has ended
}

// dialSocket opens the connection and joins the namespace "/" with the
// token. notify receives each server event on the read loop.
func dialSocket(ctx context.Context, base, token string, notify func(string, []json.RawMessage)) (*socket, error) {
	h := http.Header{}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	o := sioclient.Options{Header: h, Auth: map[string]string{"token": token}}
	if notify != nil {
		o.OnEvent = func(ev sioclient.Event) { notify(ev.Name, ev.Args) }
	}
	c, err := sioclient.Dial(ctx, base, o)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	return &socket{c: c, done: c.Done()}, nil
}

// call emits event with payload and waits for its ack, decoding the first
// ack argument into out.
func (s *socket) call(ctx context.Context, event string, payload, out any) error {
	a, err := s.c.Call(ctx, event, payload)
	if err != nil {
		return err
	}
	if len(a.Args) == 0 {
		return fmt.Errorf("%s: empty ack", event)
	}
	if out != nil {
		if err := a.Decode(out); err != nil {
			return fmt.Errorf("decode %s ack: %w", event, err)
		}
	}
	return nil
}

// close ends the connection.
func (s *socket) close() { _ = s.c.Close() }

// kill drops the connection without a close handshake (tests).
func (s *socket) kill() { s.c.Kill() }
