package main

import (
	"context"
	"fmt"

	"github.com/zndraw/joblib/internal/sio/sioclient"
)

// benchSocket is one worker's Socket.IO connection for -flow socket; server
// events the worker did not ask for are ignored.
type benchSocket struct{ c *sioclient.Client }

func dialBenchSocket(ctx context.Context, base, token string) (*benchSocket, error) {
	c, err := sioclient.Dial(ctx, base, sioclient.Options{Auth: map[string]string{"token": token}})
	if err != nil {
		return nil, err
	}
	return &benchSocket{c: c}, nil
}

// call emits event with payload and decodes the ack's first argument into out.
func (s *benchSocket) call(event string, payload, out any) error {
	a, err := s.c.Call(context.Background(), event, payload)
	if err != nil {
		return err
	}
	var status struct {
		OK     bool   `json:"ok"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}
	if err := a.Decode(&status); err != nil || !status.OK {
		return fmt.Errorf("%s refused: %d %s", event, status.Status, status.Detail)
	}
	return a.Decode(out)
}

func (s *benchSocket) close() { s.c.Kill() }
