package events

import (
	"encoding/json"
	"slices"
	"strconv"
)

// Every node's listener reads every event batch of the deployment, one
// notification after the other on one goroutine: what a batch costs to read
// bounds the events per second the whole cluster can carry, however many
// nodes it has. decodeWireBatch reads the batches the writers produce
// (PGBus.Frame's statements, encodeBatch) without reflection, and gives up
// on anything else (escapes in its own strings, unknown keys, null, invalid
// JSON), which decodeWire then hands to encoding/json. What it decodes, it
// decodes as encoding/json would (TestDecodeWireMatchesUnmarshal): an
// item's payload is the raw bytes of its value.

// decodeWire decodes one wire batch.
func decodeWire(b []byte) (wireBatch, error) {
	if batch, ok := decodeWireBatch(b); ok {
		return batch, nil
	}
	var batch wireBatch
	err := json.Unmarshal(b, &batch)
	return batch, err
}

// decodeWireBatch decodes b, reporting false when it cannot.
func decodeWireBatch(b []byte) (batch wireBatch, ok bool) {
	d := lexer{b: b}
	ok = d.object([]string{"n", "d", "ref", "s", "i", "at", "e"}, func(k int) (ok bool) {
		switch k {
		case 0:
			batch.Node, ok = d.str()
		case 1:
			batch.Scope, ok = d.str()
		case 2:
			batch.Ref, ok = d.int64()
		case 3:
			batch.Seq, ok = d.uint64()
		case 4:
			batch.ID, ok = d.uint64()
		case 5:
			batch.At, ok = d.int64()
		case 6:
			batch.Items, ok = d.items()
		}
		return ok
	})
	return batch, ok && d.end()
}

// object reads a JSON object whose keys are among keys (at most 8), each
// at most once, calling value with the key's index to read its value.
// Unknown (or differently cased) and repeated keys fail it: encoding/json
// knows what to make of them.
func (d *lexer) object(keys []string, value func(k int) bool) bool {
	if !d.consume('{') {
		return false
	}
	if d.consume('}') {
		return true
	}
	var seen uint8
	for {
		key, ok := d.plain()
		if !ok || !d.consume(':') {
			return false
		}
		k := slices.Index(keys, string(key))
		if k < 0 || seen&(1<<k) != 0 {
			return false
		}
		seen |= 1 << k
		if !value(k) {
			return false
		}
		if d.consume(',') {
			continue
		}
		return d.consume('}')
	}
}

// end reports whether only whitespace is left.
func (d *lexer) end() bool {
	d.space()
	return d.i == len(d.b)
}

// items reads a batch's array of emissions.
func (d *lexer) items() ([]wireItem, bool) {
	if !d.consume('[') {
		return nil, false
	}
	items := []wireItem{}
	if d.consume(']') {
		return items, true
	}
	for {
		it, ok := d.item()
		if !ok {
			return nil, false
		}
		items = append(items, it)
		if d.consume(',') {
			continue
		}
		return items, d.consume(']')
	}
}

// item reads one emission: its room, event name and raw payload.
func (d *lexer) item() (it wireItem, ok bool) {
	ok = d.object([]string{"r", "t", "p"}, func(k int) (ok bool) {
		switch k {
		case 0:
			it.Room, ok = d.str()
		case 1:
			it.Name, ok = d.str()
		case 2:
			d.space()
			start := d.i
			if ok = d.value(0); ok {
				it.Payload = json.RawMessage(d.b[start:d.i:d.i])
			}
		}
		return ok
	})
	return it, ok
}

// maxWireDepth bounds the nesting of a payload the fast path reads (deeper
// ones go to encoding/json, which has its own bound).
const maxWireDepth = 64

// value skips one JSON value, checking it is valid JSON, at nesting depth.
func (d *lexer) value(depth int) bool {
	if depth > maxWireDepth {
		return false
	}
	d.space()
	if d.i >= len(d.b) {
		return false
	}
	switch c := d.b[d.i]; {
	case c == '{':
		d.i++
		if d.consume('}') {
			return true
		}
		for {
			d.space()
			if !d.string() || !d.consume(':') || !d.value(depth+1) {
				return false
			}
			if d.consume(',') {
				continue
			}
			return d.consume('}')
		}
	case c == '[':
		d.i++
		if d.consume(']') {
			return true
		}
		for {
			if !d.value(depth + 1) {
				return false
			}
			if d.consume(',') {
				continue
			}
			return d.consume(']')
		}
	case c == '"':
		return d.string()
	case c == '-' || c >= '0' && c <= '9':
		return d.number()
	default:
		for _, lit := range [...]string{"true", "false", "null"} {
			if len(d.b)-d.i >= len(lit) && string(d.b[d.i:d.i+len(lit)]) == lit {
				d.i += len(lit)
				return true
			}
		}
		return false
	}
}

// string skips a JSON string at i, escapes included, checking its form.
func (d *lexer) string() bool {
	if d.i >= len(d.b) || d.b[d.i] != '"' {
		return false
	}
	for d.i++; d.i < len(d.b); d.i++ {
		switch c := d.b[d.i]; {
		case c == '"':
			d.i++
			return true
		case c < 0x20:
			return false
		case c == '\\':
			d.i++
			if d.i >= len(d.b) {
				return false
			}
			switch d.b[d.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if len(d.b)-d.i <= 4 {
					return false
				}
				for _, h := range d.b[d.i+1 : d.i+5] {
					if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
						return false
					}
				}
				d.i += 4
			default:
				return false
			}
		}
	}
	return false
}

// number skips a JSON number at i, checking its grammar.
func (d *lexer) number() bool {
	digits := func() int {
		n := 0
		for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
			d.i++
			n++
		}
		return n
	}
	if d.b[d.i] == '-' {
		d.i++
	}
	if d.i < len(d.b) && d.b[d.i] == '0' {
		d.i++
	} else if digits() == 0 {
		return false
	}
	if d.i < len(d.b) && d.b[d.i] == '.' {
		d.i++
		if digits() == 0 {
			return false
		}
	}
	if d.i < len(d.b) && (d.b[d.i] == 'e' || d.b[d.i] == 'E') {
		d.i++
		if d.i < len(d.b) && (d.b[d.i] == '+' || d.b[d.i] == '-') {
			d.i++
		}
		if digits() == 0 {
			return false
		}
	}
	return true
}

// int64 reads a JSON integer into an int64 (as encoding/json does for an
// int64 field: no fraction, no exponent).
func (d *lexer) int64() (int64, bool) {
	p, ok := d.int64Ptr()
	if !ok || p == nil {
		return 0, false
	}
	return *p, true
}

// uint64 reads a JSON integer without sign into a uint64.
func (d *lexer) uint64() (uint64, bool) {
	d.space()
	start := d.i
	for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
		d.i++
	}
	n := d.i - start
	if n == 0 || n > 1 && d.b[start] == '0' {
		return 0, false
	}
	if d.i < len(d.b) {
		if c := d.b[d.i]; c == '.' || c == 'e' || c == 'E' {
			return 0, false
		}
	}
	v, err := strconv.ParseUint(string(d.b[start:d.i]), 10, 64)
	return v, err == nil
}
