package sioclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/coder/websocket"
	"github.com/zndraw/joblib/internal/sio/wire"
)

// recorder stands for the transport: it keeps what the client writes.
type recorder struct{ frames [][]byte }

func (r *recorder) Write(_ context.Context, typ websocket.MessageType, p []byte) error {
	if typ == websocket.MessageBinary {
		p = append([]byte{'b'}, p...)
	}
	r.frames = append(r.frames, bytes.Clone(p))
	return nil
}

// frames splits a fuzz input into server frames: separated by 0x1E, a frame
// starting with 'b' is binary (the rest of it).
func frames(in []byte) (typs []websocket.MessageType, data [][]byte) {
	for _, f := range bytes.Split(in, []byte{wire.RecordSeparator}) {
		if len(f) > 0 && f[0] == 'b' {
			typs, data = append(typs, websocket.MessageBinary), append(data, f[1:])
			continue
		}
		typs, data = append(typs, websocket.MessageText), append(data, f)
	}
	return typs, data
}

// FuzzHandle feeds server frames to the client's decoder. It must never
// panic; every ping it accepts is answered with the matching pong; every
// text event of its namespace it accepts reaches OnEvent under the name the
// codec reads; an ack for a pending emit reaches that emit; a binary packet
// is delivered once all its attachments arrived, not before.
func FuzzHandle(f *testing.F) {
	for _, s := range []string{
		`0{"sid":"s","pingInterval":25000,"pingTimeout":20000}` + "\x1e" + `40{"sid":"x"}`,
		"2\x1e2probe\x1e3\x1e6",
		`42["a",1]` + "\x1e" + `42/admin,["b"]` + "\x1e" + `421["c"]`,
		`430[{"ok":true}]` + "\x1e" + `431[]` + "\x1e" + `43[1]`,
		`451-["bin",{"_placeholder":true,"num":0}]` + "\x1e" + "b\x00\x01",
		`452-["bin",{"_placeholder":true,"num":1}]` + "\x1e" + "bx\x1e" + `42["early"]`,
		`461-0[{"_placeholder":true,"num":0}]` + "\x1ebxyz",
		`451-["bad",{"_placeholder":true,"num":3}]` + "\x1eb1",
		`44{"message":"no","data":{"a":1}}`, `44"plain"`, "41", "1", "bstray", "5", "",
		`42["connect"]`, `4{"x":1}`, "40", `0{}`,
	} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, in []byte, connected bool) {
		rec := &recorder{}
		var got []Event
		c := newClient(Options{OnEvent: func(ev Event) { got = append(got, ev) }}, rec)
		if connected {
			c.opened, c.joined = true, true
		}
		pending := make(chan Ack, 1)
		c.acks[0] = pending
		typs, data := frames(in)
		for i := range data {
			wrote, events := len(rec.frames), len(got)
			wasPartial := c.partial != nil
			err := c.handle(context.Background(), typs[i], data[i])
			if err != nil {
				var ce *ConnectError
				if !errors.Is(err, wire.ErrInvalidPacket) && !errors.Is(err, ErrClosedByServer) && !errors.As(err, &ce) {
					t.Fatalf("frame %q: unexpected error type %T: %v", data[i], err, err)
				}
				return
			}
			if typs[i] == websocket.MessageBinary {
				if !wasPartial {
					t.Fatalf("binary frame %q accepted with no binary packet pending", data[i])
				}
				continue
			}
			p, _ := wire.DecodeEIO(data[i])
			if p.Type == wire.EIOPing {
				if len(rec.frames) != wrote+1 || !bytes.Equal(rec.frames[wrote], append([]byte{'3'}, p.Data...)) {
					t.Fatalf("ping %q answered with %q", data[i], rec.frames[wrote:])
				}
				continue
			}
			if len(rec.frames) != wrote {
				t.Fatalf("frame %q made the client write %q", data[i], rec.frames[wrote:])
			}
			if p.Type != wire.EIOMessage {
				continue
			}
			sp, err := wire.DecodeSIO(p.Data)
			if err != nil {
				t.Fatalf("the client accepted %q, which the codec refuses: %v", data[i], err)
			}
			switch {
			case sp.Namespace != "/":
				if len(got) != events || c.partial != nil {
					t.Fatalf("a packet of namespace %q was taken for /", sp.Namespace)
				}
			case sp.Type == wire.SIOEvent:
				name, _, _ := wire.SplitEvent(sp.Data)
				if len(got) != events+1 || got[events].Name != name || got[events].WantsAck() != sp.HasID {
					t.Fatalf("event %q delivered as %+v", data[i], got[events:])
				}
			case sp.Type == wire.SIOAck && sp.ID == 0:
				select {
				case a := <-pending:
					var want []json.RawMessage
					_ = json.Unmarshal(sp.Data, &want)
					if len(a.Args) != len(want) {
						t.Fatalf("ack %q delivered %d args", data[i], len(a.Args))
					}
				default:
					t.Fatalf("ack %q for the pending emit was not delivered", data[i])
				}
			case (sp.Type == wire.SIOBinaryEvent || sp.Type == wire.SIOBinaryAck) && sp.Attachments > 0:
				if c.partial == nil || len(got) != events {
					t.Fatalf("binary packet %q delivered before its attachments", data[i])
				}
			}
		}
		if c.partial == nil || c.partial.pkt.Attachments > 64 {
			return
		}
		// Complete the pending binary packet: it is delivered with every
		// attachment in place, or refused.
		p := c.partial
		for len(c.partial.atts) < c.partial.pkt.Attachments-1 {
			c.partial.atts = append(c.partial.atts, []byte{byte(len(c.partial.atts))})
		}
		events := len(got)
		if err := c.handle(context.Background(), websocket.MessageBinary, []byte("last")); err != nil {
			return
		}
		if p.pkt.Type == wire.SIOBinaryEvent && (len(got) != events+1 || len(got[events].Attachments) != p.pkt.Attachments) {
			t.Fatalf("completed binary event %+v delivered as %+v", p.pkt, got[events:])
		}
	})
}
