// Package jsonguard checks untrusted JSON text in one linear pass before
// anything decodes or stores it: nesting depth, UTF-8, and the escapes and
// numbers that databases reject (PostgreSQL's jsonb refuses \u0000 and
// unpaired surrogates, and numbers whose exponent overflows numeric).
//
// It does not check full JSON syntax; the decoder that runs afterwards does.
// It only needs to be right about the bytes it rejects, and it never
// recurses, so its cost is one step per input byte whatever the nesting.
package jsonguard

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// DefaultMaxDepth is the nesting depth Check allows unless told otherwise.
const DefaultMaxDepth = 64

// MaxExponent bounds the decimal exponent of a number (1e308 is the largest
// finite double; PostgreSQL's numeric overflows far beyond, at 1e131072).
const MaxExponent = 10000

// MaxNumberDigits bounds the digits of a number's mantissa: Python's json
// refuses integers longer than 4300 digits, so a worker could not read it.
const MaxNumberDigits = 4300

// Sentinel errors; every error Check returns wraps exactly one of them.
var (
	// ErrTooDeep: objects and arrays nested deeper than the budget.
	ErrTooDeep = errors.New("nested too deeply")
	// ErrInvalidUTF8: bytes that are not UTF-8.
	ErrInvalidUTF8 = errors.New("invalid UTF-8")
	// ErrNUL: a \u0000 escape (databases cannot store NUL in text or jsonb).
	ErrNUL = errors.New(`NUL character (\u0000)`)
	// ErrSurrogate: a \uD800-\uDFFF escape that is not half of a valid pair.
	ErrSurrogate = errors.New("unpaired UTF-16 surrogate escape")
	// ErrNumber: a number whose exponent is out of range.
	ErrNumber = errors.New("number out of range")
)

// Error locates a rejected byte.
type Error struct {
	// Offset is the byte offset in the checked text.
	Offset int
	// Err is one of the package's sentinels.
	Err error
	// MaxDepth is the budget, for ErrTooDeep.
	MaxDepth int
}

func (e *Error) Error() string {
	if errors.Is(e.Err, ErrTooDeep) {
		return fmt.Sprintf("JSON %s (more than %d levels) at byte %d", e.Err, e.MaxDepth, e.Offset)
	}
	return fmt.Sprintf("JSON %s at byte %d", e.Err, e.Offset)
}

func (e *Error) Unwrap() error { return e.Err }

// Depth checks only the nesting depth of data against maxDepth (<= 0 means
// DefaultMaxDepth). It is the cheap check for text already known to be
// valid UTF-8 (a websocket text frame, for example).
func Depth(data []byte, maxDepth int) error {
	if maxDepth <= 0 {
		maxDepth = DefaultMaxDepth
	}
	depth := 0
	inString := false
	for i := 0; i < len(data); i++ {
		c := data[i]
		if inString {
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			depth++
			if depth > maxDepth {
				return &Error{Offset: i, Err: ErrTooDeep, MaxDepth: maxDepth}
			}
		case '}', ']':
			depth--
		}
	}
	return nil
}

// Check validates data in one pass: nesting no deeper than maxDepth (<= 0
// means DefaultMaxDepth), valid UTF-8, no \u0000 escape, no unpaired
// surrogate escape, no number exponent beyond ±MaxExponent. The error is an
// *Error wrapping one of the sentinels.
func Check(data []byte, maxDepth int) error {
	if maxDepth <= 0 {
		maxDepth = DefaultMaxDepth
	}
	depth := 0
	for i := 0; i < len(data); {
		c := data[i]
		switch {
		case c == '"':
			n, err := scanString(data, i+1)
			if err != nil {
				return err
			}
			i = n
			continue
		case c == '{' || c == '[':
			depth++
			if depth > maxDepth {
				return &Error{Offset: i, Err: ErrTooDeep, MaxDepth: maxDepth}
			}
		case c == '}' || c == ']':
			depth--
		case c == '-' || (c >= '0' && c <= '9'):
			n, err := scanNumber(data, i)
			if err != nil {
				return err
			}
			i = n
			continue
		case c >= utf8.RuneSelf:
			r, size := utf8.DecodeRune(data[i:])
			if r == utf8.RuneError && size <= 1 {
				return &Error{Offset: i, Err: ErrInvalidUTF8}
			}
			i += size
			continue
		}
		i++
	}
	return nil
}

// scanString checks a string whose opening quote precedes i and returns the
// offset after its closing quote (or len(data) when unterminated).
func scanString(data []byte, i int) (int, error) {
	for i < len(data) {
		c := data[i]
		switch {
		case c == '"':
			return i + 1, nil
		case c == '\\':
			if i+1 < len(data) && data[i+1] == 'u' {
				r, ok := hex4(data, i+2)
				if !ok {
					i += 2 // the decoder reports the malformed escape
					continue
				}
				switch {
				case r == 0:
					return 0, &Error{Offset: i, Err: ErrNUL}
				case r >= 0xD800 && r < 0xDC00:
					// A high surrogate must be followed by \u<low>.
					lo, ok := -1, false
					if i+7 < len(data) && data[i+6] == '\\' && data[i+7] == 'u' {
						lo, ok = hex4(data, i+8)
					}
					if !ok || lo < 0xDC00 || lo > 0xDFFF {
						return 0, &Error{Offset: i, Err: ErrSurrogate}
					}
					i += 12
					continue
				case r >= 0xDC00 && r <= 0xDFFF:
					return 0, &Error{Offset: i, Err: ErrSurrogate}
				}
				i += 6
				continue
			}
			i += 2
		case c >= utf8.RuneSelf:
			r, size := utf8.DecodeRune(data[i:])
			if r == utf8.RuneError && size <= 1 {
				return 0, &Error{Offset: i, Err: ErrInvalidUTF8}
			}
			i += size
		default:
			i++
		}
	}
	return i, nil
}

// scanNumber checks the number starting at i and returns the offset after it.
func scanNumber(data []byte, i int) (int, error) {
	start, digits := i, 0
	for i < len(data) && (data[i] == '-' || data[i] == '+' || data[i] == '.' || (data[i] >= '0' && data[i] <= '9')) {
		if data[i] >= '0' {
			digits++
		}
		i++
	}
	if digits > MaxNumberDigits {
		return 0, &Error{Offset: start, Err: ErrNumber}
	}
	if i < len(data) && (data[i] == 'e' || data[i] == 'E') {
		i++
		if i < len(data) && (data[i] == '+' || data[i] == '-') {
			i++
		}
		exp := 0
		for i < len(data) && data[i] >= '0' && data[i] <= '9' {
			if exp <= MaxExponent {
				exp = exp*10 + int(data[i]-'0')
			}
			i++
		}
		if exp > MaxExponent {
			return 0, &Error{Offset: start, Err: ErrNumber}
		}
	}
	return i, nil
}

// hex4 decodes four hex digits at data[i:i+4].
func hex4(data []byte, i int) (int, bool) {
	if i+4 > len(data) {
		return 0, false
	}
	r := 0
	for _, c := range data[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | int(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | int(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | int(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}
