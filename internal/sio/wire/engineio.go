// Package wire is the codec for Engine.IO protocol v4 and Socket.IO protocol v5.
//
// It only turns bytes into packets and back; sessions, heartbeats, transports and
// acknowledgements live in the server (package server/sio) and in the Go client
// (package internal/sio/sioclient), which both use it. Every decoder is strict: anything the
// reference parsers (engine.io-parser 5, socket.io-parser 4.2) would reject is an
// error here, so the server can close the offending connection.
//
// Engine.IO: [DecodeEIO], [AppendEIO] for one packet (a websocket text frame or a
// polling segment); a websocket binary frame is always a message packet with
// Binary set. [DecodePayload] and [AppendPayload] handle HTTP long-polling bodies:
// packets joined by the record separator 0x1E, binary packets as "b" + base64.
//
// Socket.IO: [DecodeSIO] and [AppendSIO] for one packet carried inside an
// Engine.IO message. Binary attachments travel as separate Engine.IO binary
// messages after the header packet; [Deconstruct] replaces []byte values by
// placeholders {"_placeholder":true,"num":k}, [CheckPlaceholders],
// [Reconstruct] and [InlineAttachments] go the other way.
package wire

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
)

// EIOType is an Engine.IO packet type.
type EIOType byte

// Engine.IO packet types; on the wire each is the ASCII digit '0'+type.
const (
	EIOOpen    EIOType = 0 // server → client handshake
	EIOClose   EIOType = 1 // close the session
	EIOPing    EIOType = 2 // server heartbeat, or "probe" from the client during an upgrade
	EIOPong    EIOType = 3 // heartbeat reply, or "probe" from the server during an upgrade
	EIOMessage EIOType = 4 // carries one Socket.IO packet or one binary attachment
	EIOUpgrade EIOType = 5 // client → server: switch to the probed transport
	EIONoop    EIOType = 6 // filler that releases a pending long-poll
)

var eioNames = [...]string{"open", "close", "ping", "pong", "message", "upgrade", "noop"}

func (t EIOType) String() string {
	if int(t) < len(eioNames) {
		return eioNames[t]
	}
	return fmt.Sprintf("EIOType(%d)", byte(t))
}

// RecordSeparator joins packets in a polling payload.
const RecordSeparator = 0x1E

// ErrInvalidPacket is wrapped by every decoding error of this package.
var ErrInvalidPacket = errors.New("invalid packet")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidPacket, fmt.Sprintf(format, args...))
}

// EIOPacket is one Engine.IO packet.
type EIOPacket struct {
	Type EIOType
	// Data is the text after the type digit, or the raw bytes of a binary message.
	// Decoders return slices of their input.
	Data []byte
	// Binary marks a binary message (Type is then EIOMessage).
	Binary bool
}

// DecodeEIO decodes a text packet: a websocket text frame or one polling segment
// without the "b" prefix. An empty input or an unknown type digit is an error.
func DecodeEIO(text []byte) (EIOPacket, error) {
	if len(text) == 0 {
		return EIOPacket{}, invalid("empty engine.io packet")
	}
	c := text[0]
	if c < '0' || c > '6' {
		return EIOPacket{}, invalid("unknown engine.io packet type %q", c)
	}
	return EIOPacket{Type: EIOType(c - '0'), Data: text[1:]}, nil
}

// AppendEIO appends the text form of p ("<digit><data>") to dst. A binary packet is
// appended in its polling form ("b" + base64), because text transports cannot carry
// raw bytes; websocket writers send p.Data as a binary frame instead.
func AppendEIO(dst []byte, p EIOPacket) []byte {
	if p.Binary {
		dst = append(dst, 'b')
		return base64.StdEncoding.AppendEncode(dst, p.Data)
	}
	dst = append(dst, '0'+byte(p.Type))
	return append(dst, p.Data...)
}

// DecodePayload splits an HTTP long-polling body into packets. Each segment is a
// text packet or "b" followed by standard base64 (a binary message). An empty body,
// an empty segment or bad base64 is an error.
func DecodePayload(body []byte) ([]EIOPacket, error) {
	if len(body) == 0 {
		return nil, invalid("empty payload")
	}
	n := bytes.Count(body, []byte{RecordSeparator}) + 1
	pkts := make([]EIOPacket, 0, n)
	for {
		seg, rest, more := bytes.Cut(body, []byte{RecordSeparator})
		p, err := decodeSegment(seg)
		if err != nil {
			return nil, fmt.Errorf("decode payload segment %d: %w", len(pkts), err)
		}
		pkts = append(pkts, p)
		if !more {
			return pkts, nil
		}
		body = rest
	}
}

func decodeSegment(seg []byte) (EIOPacket, error) {
	if len(seg) > 0 && seg[0] == 'b' {
		enc := seg[1:]
		data := make([]byte, base64.StdEncoding.DecodedLen(len(enc)))
		m, err := base64.StdEncoding.Decode(data, enc)
		if err != nil {
			return EIOPacket{}, invalid("bad base64 in binary segment: %v", err)
		}
		return EIOPacket{Type: EIOMessage, Data: data[:m], Binary: true}, nil
	}
	return DecodeEIO(seg)
}

// AppendPayload appends pkts joined by the record separator, binary packets as
// "b" + base64.
func AppendPayload(dst []byte, pkts []EIOPacket) []byte {
	for i, p := range pkts {
		if i > 0 {
			dst = append(dst, RecordSeparator)
		}
		dst = AppendEIO(dst, p)
	}
	return dst
}
