package events

import (
	"strconv"
	"unicode/utf8"
)

// The status event is the one a sweep or a busy node encodes tens of
// thousands of times (one per task a cleanup releases, one per report): it
// is written by hand here, byte for byte what encoding/json writes for it
// (TestAppendJSONMatchesMarshal), without reflection. A sweep of 50,000
// tasks spent a quarter of its Go CPU time in json.Marshal of this struct.

// jsonAppender is an event that appends its own JSON.
type jsonAppender interface {
	appendJSON(b []byte) []byte
}

func (e TaskStatusEvent) appendJSON(b []byte) []byte {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, e.ID)
	b = append(b, `,"name":`...)
	b = appendJSONString(b, e.Name)
	b = append(b, `,"room_id":`...)
	b = appendJSONString(b, e.RoomID)
	b = append(b, `,"status":`...)
	b = appendJSONString(b, e.Status)
	b = append(b, `,"created_at":`...)
	b = e.CreatedAt.appendJSON(b)
	b = append(b, `,"started_at":`...)
	b = e.StartedAt.appendJSON(b)
	b = append(b, `,"completed_at":`...)
	b = e.CompletedAt.appendJSON(b)
	b = append(b, `,"queue_position":`...)
	if e.QueuePosition == nil {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendInt(b, *e.QueuePosition, 10)
	}
	b = append(b, `,"worker_id":`...)
	b = appendJSONNullString(b, e.WorkerID)
	b = append(b, `,"error":`...)
	b = appendJSONNullString(b, e.Error)
	return append(b, '}')
}

// appendJSON appends what MarshalJSON returns.
func (t Time) appendJSON(b []byte) []byte {
	if t.IsZero() {
		return append(b, "null"...)
	}
	b = append(b, '"')
	b = t.UTC().AppendFormat(b, TimeLayout)
	return append(b, '"')
}

func appendJSONNullString(b []byte, s *string) []byte {
	if s == nil {
		return append(b, "null"...)
	}
	return appendJSONString(b, *s)
}

// appendJSONString appends s as encoding/json does with its default HTML
// escaping: <, > and & as \u escapes, U+2028 and U+2029 escaped, invalid
// UTF-8 as U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
