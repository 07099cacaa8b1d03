package events

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// Every node's listener decodes every status event of the deployment, most
// of them written by PostgreSQL's json_build_object in the hot statements:
// decodeStatusEvent reads the forms its writers produce (that one,
// encoding/json's and appendJSON's) without reflection, and gives up on
// anything else (escapes, unknown or differently cased keys, a null where
// a string belongs, invalid JSON), which Decode then hands to
// encoding/json. What it does decode, it decodes as encoding/json would
// (TestDecodeStatusEventMatchesUnmarshal).

// decodeStatusEvent decodes b, reporting false when it cannot.
func decodeStatusEvent(b []byte) (ev TaskStatusEvent, ok bool) {
	d := lexer{b: b}
	if !d.consume('{') {
		return ev, false
	}
	for {
		key, ok := d.plain()
		if !ok || !d.consume(':') {
			return ev, false
		}
		switch string(key) {
		case "id":
			ev.ID, ok = d.str()
		case "name":
			ev.Name, ok = d.str()
		case "room_id":
			ev.RoomID, ok = d.str()
		case "status":
			ev.Status, ok = d.str()
		case "created_at":
			ev.CreatedAt, ok = d.time()
		case "started_at":
			ev.StartedAt, ok = d.time()
		case "completed_at":
			ev.CompletedAt, ok = d.time()
		case "queue_position":
			ev.QueuePosition, ok = d.int64Ptr()
		case "worker_id":
			ev.WorkerID, ok = d.strPtr()
		case "error":
			ev.Error, ok = d.strPtr()
		default:
			return ev, false
		}
		if !ok {
			return ev, false
		}
		if d.consume(',') {
			continue
		}
		if !d.consume('}') {
			return ev, false
		}
		d.space()
		return ev, d.i == len(d.b)
	}
}

// lexer reads JSON tokens from b at i.
type lexer struct {
	b []byte
	i int
}

func (d *lexer) space() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// consume skips whitespace and then c, reporting whether c was there.
func (d *lexer) consume(c byte) bool {
	d.space()
	if d.i < len(d.b) && d.b[d.i] == c {
		d.i++
		return true
	}
	return false
}

// null consumes a null literal, if it is next.
func (d *lexer) null() bool {
	d.space()
	if len(d.b)-d.i >= 4 && string(d.b[d.i:d.i+4]) == "null" {
		d.i += 4
		return true
	}
	return false
}

// plain reads a string without escapes and of valid UTF-8: its bytes are
// its value.
func (d *lexer) plain() ([]byte, bool) {
	if !d.consume('"') {
		return nil, false
	}
	start, ascii := d.i, true
	for ; d.i < len(d.b); d.i++ {
		switch c := d.b[d.i]; {
		case c == '"':
			s := d.b[start:d.i]
			d.i++
			return s, ascii || utf8.Valid(s)
		case c == '\\' || c < 0x20:
			return nil, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return nil, false
}

func (d *lexer) str() (string, bool) {
	s, ok := d.plain()
	return string(s), ok
}

func (d *lexer) strPtr() (*string, bool) {
	if d.null() {
		return nil, true
	}
	s, ok := d.str()
	if !ok {
		return nil, false
	}
	return &s, true
}

// time reads a Time as Time.UnmarshalJSON does.
func (d *lexer) time() (Time, bool) {
	if d.null() {
		return Time{}, true
	}
	s, ok := d.plain()
	if !ok {
		return Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, string(s))
	if err != nil {
		return Time{}, false
	}
	return Time{t.UTC()}, true
}

// int64Ptr reads a JSON integer (no fraction, no exponent, no leading
// zero) or null.
func (d *lexer) int64Ptr() (*int64, bool) {
	if d.null() {
		return nil, true
	}
	d.space()
	start := d.i
	if d.i < len(d.b) && d.b[d.i] == '-' {
		d.i++
	}
	digits := d.i
	for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
		d.i++
	}
	n := d.i - digits
	if n == 0 || n > 1 && d.b[digits] == '0' {
		return nil, false
	}
	if d.i < len(d.b) {
		if c := d.b[d.i]; c == '.' || c == 'e' || c == 'E' {
			return nil, false
		}
	}
	v, err := strconv.ParseInt(string(d.b[start:d.i]), 10, 64)
	if err != nil {
		return nil, false
	}
	return &v, true
}
