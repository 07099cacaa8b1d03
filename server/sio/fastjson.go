package sio

import (
	"encoding/json"
	"slices"
	"unicode/utf8"
)

// JSON is an event argument that is already JSON as encoding/json writes
// it: valid, compact, with <, > and & escaped (\u003c…) and U+2028, U+2029
// escaped. The sender vouches for its validity: the emitters write it
// without parsing it again (encoding/json validates and compacts every
// json.RawMessage it marshals, which cost a broadcast more than building
// its packet). An argument that is not compact or has a character
// encoding/json would escape is still written through encoding/json, so
// the packet's bytes are the same either way.
type JSON []byte

// MarshalJSON implements json.Marshaler: the bytes themselves.
func (j JSON) MarshalJSON() ([]byte, error) {
	if len(j) == 0 {
		return []byte("null"), nil
	}
	return j, nil
}

// appendArgsJSON appends the JSON array [event, args...] to dst, as
// json.Marshal would write it, when every argument is a JSON in
// encoding/json's own form or a string encoding/json writes unescaped; ok
// is false otherwise, and dst is returned unchanged.
func appendArgsJSON(dst []byte, event string, args []any) (out []byte, ok bool) {
	if !plainString(event) {
		return dst, false
	}
	for _, a := range args {
		switch v := a.(type) {
		case JSON:
			if !marshalForm(v) {
				return dst, false
			}
		case string:
			if !plainString(v) {
				return dst, false
			}
		default:
			return dst, false
		}
	}
	n := len(event) + 4
	for _, a := range args {
		switch v := a.(type) {
		case JSON:
			n += len(v) + 1
		case string:
			n += len(v) + 3
		}
	}
	out = append(slices.Grow(dst, n), '[', '"')
	out = append(out, event...)
	out = append(out, '"')
	for _, a := range args {
		out = append(out, ',')
		switch v := a.(type) {
		case JSON:
			out = append(out, v...)
		case string:
			out = append(out, '"')
			out = append(out, v...)
			out = append(out, '"')
		}
	}
	return append(out, ']'), true
}

// plainString reports whether encoding/json writes s as its bytes between
// quotes: printable ASCII other than the quote, the backslash and the HTML
// characters it escapes.
func plainString(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// marshalForm reports whether json.Marshal would write the (valid) JSON j
// unchanged: nothing outside its strings is whitespace, and nothing inside
// them is a character it escapes (<, >, &, U+2028, U+2029; the rest a valid
// string already has escaped). Invalid UTF-8 is left to encoding/json.
func marshalForm(j JSON) bool {
	if len(j) == 0 {
		return false
	}
	in := false
	for i := 0; i < len(j); i++ {
		c := j[i]
		if in {
			if !stringSpecial[c] {
				continue
			}
			switch {
			case c == '\\':
				i++ // the escaped character, whatever it is
			case c == '"':
				in = false
			case c >= utf8.RuneSelf:
				r, n := utf8.DecodeRune(j[i:])
				if r == utf8.RuneError && n == 1 || r == '\u2028' || r == '\u2029' {
					return false
				}
				i += n - 1
			default: // <, >, &
				return false
			}
			continue
		}
		if !tokenSpecial[c] {
			continue
		}
		if c != '"' {
			return false // whitespace (or, in invalid JSON, anything not ASCII)
		}
		in = true
	}
	return !in
}

// stringSpecial and tokenSpecial are the bytes marshalForm looks at, inside
// strings and between them.
var stringSpecial, tokenSpecial = func() (s, t [256]bool) {
	for _, c := range []byte{'\\', '"', '<', '>', '&'} {
		s[c] = true
	}
	for _, c := range []byte{'"', ' ', '\t', '\n', '\r'} {
		t[c] = true
	}
	for c := utf8.RuneSelf; c < 256; c++ {
		s[c], t[c] = true, true
	}
	return s, t
}()

var _ json.Marshaler = JSON(nil)
