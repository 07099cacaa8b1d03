// Package canonical renders values as the Python server's canonical JSON
// (json.dumps with sorted keys, no spaces and ensure_ascii) and hashes them:
// the identity of a provider read (contract §7.4). The server and the Go
// SDK both use it, so an SDK upload names the same cache entry the server
// waits on.
package canonical

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// RequestHash is the identity of a provider read (contract §7.4): the
// lowercase hex SHA-256 of the canonical JSON of its parameters. It is
// byte-compatible with the Python server's
// sha256(json.dumps(params, sort_keys=True, separators=(",", ":"))), so a
// client that computes the hash itself addresses the same cache entry.
func RequestHash(params map[string]string) string {
	return Hash(CanonicalParams(params))
}

// CanonicalParams is the canonical JSON of read parameters: the string sent
// as provider_request.params and hashed by RequestHash.
func CanonicalParams(params map[string]string) string {
	keys := make([]string, 0, len(params))
	for k := range params {
		keys = append(keys, k)
	}
	slices.Sort(keys) // byte order of UTF-8 is code point order, as Python sorts
	var b strings.Builder
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		writePyString(&b, k)
		b.WriteByte(':')
		writePyString(&b, params[k])
	}
	b.WriteByte('}')
	return b.String()
}

// CanonicalJSON renders a JSON-like value the way Python's
// json.dumps(v, sort_keys=True, separators=(",", ":")) does with its default
// ensure_ascii=True. It accepts nil, bool, string, the integer types,
// float64, json.Number, map[string]any, map[string]string and []any;
// anything else is an error. Strings must be valid UTF-8.
func CanonicalJSON(v any) (string, error) {
	var b strings.Builder
	if err := writeCanonical(&b, v); err != nil {
		return "", err
	}
	return b.String(), nil
}

// RequestHashOf is RequestHash for any value CanonicalJSON accepts.
func RequestHashOf(v any) (string, error) {
	s, err := CanonicalJSON(v)
	if err != nil {
		return "", err
	}
	return Hash(s), nil
}

// Hash is the lowercase hex SHA-256 of a canonical JSON string.
func Hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func writeCanonical(b *strings.Builder, v any) error {
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		if x {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case string:
		if !utf8.ValidString(x) {
			return fmt.Errorf("canonical json: string %q is not valid UTF-8", x)
		}
		writePyString(b, x)
	case int:
		b.WriteString(strconv.FormatInt(int64(x), 10))
	case int32:
		b.WriteString(strconv.FormatInt(int64(x), 10))
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case uint64:
		b.WriteString(strconv.FormatUint(x, 10))
	case float64:
		b.WriteString(pyFloat(x))
	case json.Number:
		if i, err := x.Int64(); err == nil {
			b.WriteString(strconv.FormatInt(i, 10))
			return nil
		}
		f, err := x.Float64()
		if err != nil {
			return fmt.Errorf("canonical json: number %q: %w", x, err)
		}
		b.WriteString(pyFloat(f))
	case map[string]string:
		b.WriteString(CanonicalParams(x))
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			if !utf8.ValidString(k) {
				return fmt.Errorf("canonical json: key %q is not valid UTF-8", k)
			}
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writePyString(b, k)
			b.WriteByte(':')
			if err := writeCanonical(b, x[k]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeCanonical(b, e); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	default:
		return fmt.Errorf("canonical json: unsupported type %T", v)
	}
	return nil
}

const hexDigits = "0123456789abcdef"

// writePyString writes s as a JSON string escaped like Python's ensure_ascii:
// `"` and `\` escaped, \n \r \t \b \f short, every other rune outside
// printable ASCII as \uXXXX in lowercase hex (astral runes as a surrogate
// pair). '/', '<', '>' and '&' stay as they are. Invalid UTF-8 bytes come
// out as \ufffd (callers that care reject them first).
func writePyString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r >= 0x20 && r <= 0x7e:
			b.WriteByte(byte(r))
		case r > 0xffff:
			r -= 0x10000
			writeU16(b, 0xd800+uint16(r>>10))
			writeU16(b, 0xdc00+uint16(r&0x3ff))
		default:
			writeU16(b, uint16(r))
		}
	}
	b.WriteByte('"')
}

func writeU16(b *strings.Builder, u uint16) {
	b.WriteString(`\u`)
	b.WriteByte(hexDigits[u>>12&0xf])
	b.WriteByte(hexDigits[u>>8&0xf])
	b.WriteByte(hexDigits[u>>4&0xf])
	b.WriteByte(hexDigits[u&0xf])
}

// pyFloat formats f like Python's float repr (which json.dumps uses): the
// shortest round-tripping digits, positional for exponents in [-4, 16)
// with at least one fractional digit, scientific otherwise with a signed,
// at least two-digit exponent; NaN and infinities as json.dumps writes them.
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	// 'e' with -1 precision gives the shortest digits: [-]d[.ddd]e±XX.
	e := strconv.FormatFloat(f, 'e', -1, 64)
	mant, expStr, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(expStr)
	sign := ""
	if strings.HasPrefix(mant, "-") {
		sign, mant = "-", mant[1:]
	}
	digits := strings.Replace(mant, ".", "", 1)
	if exp < -4 || exp >= 16 {
		out := digits[:1]
		if len(digits) > 1 {
			out += "." + digits[1:]
		}
		es := "+"
		if exp < 0 {
			es, exp = "-", -exp
		}
		return fmt.Sprintf("%s%se%s%02d", sign, out, es, exp)
	}
	// Positional: the decimal point goes after exp+1 digits.
	point := exp + 1
	var intPart, frac string
	switch {
	case point <= 0:
		intPart, frac = "0", strings.Repeat("0", -point)+digits
	case point >= len(digits):
		intPart, frac = digits+strings.Repeat("0", point-len(digits)), "0"
	default:
		intPart, frac = digits[:point], digits[point:]
	}
	return sign + intPart + "." + frac
}
