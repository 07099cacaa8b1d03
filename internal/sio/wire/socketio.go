package wire

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
)

// SIOType is a Socket.IO packet type.
type SIOType byte

// Socket.IO packet types; on the wire each is the ASCII digit '0'+type.
const (
	SIOConnect      SIOType = 0 // join a namespace (client: optional auth object; server: {"sid":...})
	SIODisconnect   SIOType = 1 // leave a namespace; no payload
	SIOEvent        SIOType = 2 // [name, args...]
	SIOAck          SIOType = 3 // [args...] for the event with the same ack id
	SIOConnectError SIOType = 4 // {"message":..., "data":...}
	SIOBinaryEvent  SIOType = 5 // like SIOEvent, followed by binary attachments
	SIOBinaryAck    SIOType = 6 // like SIOAck, followed by binary attachments
)

var sioNames = [...]string{"CONNECT", "DISCONNECT", "EVENT", "ACK", "CONNECT_ERROR", "BINARY_EVENT", "BINARY_ACK"}

func (t SIOType) String() string {
	if int(t) < len(sioNames) {
		return sioNames[t]
	}
	return fmt.Sprintf("SIOType(%d)", byte(t))
}

// MaxAttachments bounds the attachment count a decoded packet may announce.
const MaxAttachments = 1 << 16

// maxIDDigits mirrors python-socketio, which refuses ack ids of 100 digits or more;
// we additionally require the id to fit in a uint64.
const maxIDDigits = 20

// SIOPacket is one Socket.IO packet.
type SIOPacket struct {
	Type SIOType
	// Namespace is "/" unless the packet names another one.
	Namespace string
	// ID is the ack id; it is only meaningful when HasID is set (0 is a valid id).
	ID    uint64
	HasID bool
	// Attachments is the number of binary attachments that follow a
	// SIOBinaryEvent or SIOBinaryAck.
	Attachments int
	// Data is the JSON payload, nil when absent. Decoders return a slice of their input.
	Data json.RawMessage
}

// reservedEvents cannot be emitted: the JS client treats a packet carrying one of
// these names as a parse error and drops the connection.
var reservedEvents = map[string]bool{
	"connect":        true,
	"connect_error":  true,
	"disconnect":     true,
	"disconnecting":  true,
	"newListener":    true,
	"removeListener": true,
}

// IsReservedEvent reports whether name is reserved by the Socket.IO clients.
func IsReservedEvent(name string) bool { return reservedEvents[name] }

// DecodeSIO decodes one Socket.IO packet (the data of an Engine.IO text message).
//
// Rules, as socket.io-parser applies them: the type digit must be 0–6; binary
// types carry a decimal attachment count followed by '-'; a namespace starts with
// '/' and runs to the first ',' (or the end); the ack id is the maximal run of
// digits; the payload, when present, must be valid JSON of the shape the type
// requires (CONNECT: object; DISCONNECT: none; EVENT: array whose first element
// is a non-reserved string; ACK: array; CONNECT_ERROR: object or string).
func DecodeSIO(b []byte) (SIOPacket, error) {
	if len(b) == 0 {
		return SIOPacket{}, invalid("empty socket.io packet")
	}
	if b[0] < '0' || b[0] > '6' {
		return SIOPacket{}, invalid("unknown socket.io packet type %q", b[0])
	}
	p := SIOPacket{Type: SIOType(b[0] - '0'), Namespace: "/"}
	i := 1

	if p.Type == SIOBinaryEvent || p.Type == SIOBinaryAck {
		start := i
		for i < len(b) && isDigit(b[i]) {
			i++
		}
		if i == start || i >= len(b) || b[i] != '-' {
			return SIOPacket{}, invalid("illegal attachments count")
		}
		n, err := strconv.Atoi(string(b[start:i]))
		if err != nil || n > MaxAttachments {
			return SIOPacket{}, invalid("illegal attachments count %q", b[start:i])
		}
		p.Attachments = n
		i++ // '-'
	}

	if i < len(b) && b[i] == '/' {
		end := bytes.IndexByte(b[i:], ',')
		if end < 0 {
			p.Namespace = string(b[i:])
			i = len(b)
		} else {
			p.Namespace = string(b[i : i+end])
			i += end + 1
		}
	}

	if i < len(b) && isDigit(b[i]) {
		start := i
		for i < len(b) && isDigit(b[i]) {
			i++
		}
		if i-start > maxIDDigits {
			return SIOPacket{}, invalid("ack id too long")
		}
		id, err := strconv.ParseUint(string(b[start:i]), 10, 64)
		if err != nil {
			return SIOPacket{}, invalid("ack id out of range")
		}
		p.ID, p.HasID = id, true
	}

	if i < len(b) {
		p.Data = json.RawMessage(b[i:])
		if err := checkPayload(p.Type, p.Data); err != nil {
			return SIOPacket{}, err
		}
	}
	if p.Type == SIOBinaryEvent || p.Type == SIOBinaryAck || p.Type == SIOEvent || p.Type == SIOAck {
		if p.Data == nil {
			return SIOPacket{}, invalid("%v without payload", p.Type)
		}
	}
	return p, nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// jsonKind returns the first non-space byte of valid JSON, or 0 if v is not valid JSON.
func jsonKind(v []byte) byte {
	if !json.Valid(v) {
		return 0
	}
	for _, c := range v {
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		}
		return c
	}
	return 0
}

func checkPayload(t SIOType, data []byte) error {
	k := jsonKind(data)
	if k == 0 {
		return invalid("%v payload is not valid JSON", t)
	}
	switch t {
	case SIOConnect:
		if k != '{' {
			return invalid("CONNECT payload must be an object")
		}
	case SIODisconnect:
		return invalid("DISCONNECT must not have a payload")
	case SIOConnectError:
		if k != '{' && k != '"' {
			return invalid("CONNECT_ERROR payload must be an object or a string")
		}
	case SIOAck, SIOBinaryAck:
		if k != '[' {
			return invalid("%v payload must be an array", t)
		}
	case SIOEvent, SIOBinaryEvent:
		if k != '[' {
			return invalid("%v payload must be an array", t)
		}
		if _, _, err := SplitEvent(data); err != nil {
			return err
		}
	}
	return nil
}

// SplitEvent splits an EVENT payload into its name and its arguments (as raw JSON).
// The first element must be a string that is not a reserved event name.
func SplitEvent(data json.RawMessage) (string, []json.RawMessage, error) {
	var elems []json.RawMessage
	if err := json.Unmarshal(data, &elems); err != nil {
		return "", nil, invalid("event payload: %v", err)
	}
	if len(elems) == 0 {
		return "", nil, invalid("event payload is an empty array")
	}
	var name string
	if jsonKind(elems[0]) != '"' {
		return "", nil, invalid("event name must be a string")
	}
	if err := json.Unmarshal(elems[0], &name); err != nil {
		return "", nil, invalid("event name: %v", err)
	}
	if IsReservedEvent(name) {
		return "", nil, invalid("reserved event name %q", name)
	}
	return name, elems[1:], nil
}

// AppendSIO appends the text encoding of p to dst: type digit, "<n>-" for binary
// types, "<namespace>," unless the namespace is "/" (or empty), the ack id when
// HasID is set, then Data verbatim.
func AppendSIO(dst []byte, p SIOPacket) []byte {
	dst = append(dst, '0'+byte(p.Type))
	if p.Type == SIOBinaryEvent || p.Type == SIOBinaryAck {
		dst = strconv.AppendInt(dst, int64(p.Attachments), 10)
		dst = append(dst, '-')
	}
	if p.Namespace != "" && p.Namespace != "/" {
		dst = append(dst, p.Namespace...)
		dst = append(dst, ',')
	}
	if p.HasID {
		dst = strconv.AppendUint(dst, p.ID, 10)
	}
	return append(dst, p.Data...)
}
