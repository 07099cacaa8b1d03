package sioclient

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/coder/websocket"
	"github.com/zndraw/joblib/internal/sio/wire"
)

// pollWriter sends frames as HTTP long-polling POSTs (binary ones as
// "b" + base64).
type pollWriter struct {
	hc     *http.Client
	header http.Header
	url    string
}

func (pw *pollWriter) do(ctx context.Context, method string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, pw.url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, v := range pw.header {
		req.Header[k] = v
	}
	res, err := pw.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err == nil && res.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: %d %.200s", method, res.StatusCode, b)
	}
	return b, err
}

func (pw *pollWriter) Write(ctx context.Context, typ websocket.MessageType, p []byte) error {
	if typ == websocket.MessageBinary {
		p = wire.AppendEIO(nil, wire.EIOPacket{Type: wire.EIOMessage, Data: p, Binary: true})
	}
	_, err := pw.do(ctx, http.MethodPost, p)
	return err
}

// pollAndJoin opens the session with HTTP long-polling and joins the
// namespace over it.
func (c *Client) pollAndJoin(ctx context.Context, base string, o Options, auth json.RawMessage) error {
	hc := o.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	pw := &pollWriter{hc: hc, header: o.Header, url: strings.TrimSuffix(base, "/") + "/socket.io/?EIO=4&transport=polling"}
	c.w = pw
	if err := c.pollUntil(ctx, pw, func() bool { return c.opened }); err != nil {
		return fmt.Errorf("engine.io open: %w", err)
	}
	pw.url += "&sid=" + c.sid
	if err := c.writeConnect(ctx, auth); err != nil {
		return err
	}
	return c.pollUntil(ctx, pw, func() bool { return c.joined })
}

// pollUntil polls and handles what arrives until cond holds.
func (c *Client) pollUntil(ctx context.Context, pw *pollWriter, cond func() bool) error {
	for !cond() {
		body, err := pw.do(ctx, http.MethodGet, nil)
		if err != nil {
			return fmt.Errorf("poll: %w", err)
		}
		pkts, err := wire.DecodePayload(body)
		if err != nil {
			return err
		}
		for _, p := range pkts {
			typ, data := websocket.MessageText, wire.AppendEIO(nil, p)
			if p.Binary {
				typ, data = websocket.MessageBinary, p.Data
			}
			if err := c.handle(ctx, typ, data); err != nil {
				return err
			}
		}
	}
	return nil
}

// upgrade moves the session onto the websocket ws: probe, then upgrade.
func upgrade(ctx context.Context, ws *websocket.Conn) error {
	if err := ws.Write(ctx, websocket.MessageText, wire.AppendEIO(nil, wire.EIOPacket{Type: wire.EIOPing, Data: []byte("probe")})); err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	typ, data, err := ws.Read(ctx)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	if p, perr := wire.DecodeEIO(data); typ != websocket.MessageText || perr != nil || p.Type != wire.EIOPong || string(p.Data) != "probe" {
		return fmt.Errorf("probe answered %.40q", data)
	}
	if err := ws.Write(ctx, websocket.MessageText, wire.AppendEIO(nil, wire.EIOPacket{Type: wire.EIOUpgrade})); err != nil {
		return fmt.Errorf("upgrade: %w", err)
	}
	return nil
}
