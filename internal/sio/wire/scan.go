package wire

import "strconv"

// skipString returns the index of the quote closing the string opened at i
// (or len(data)-1 if it is not closed).
func skipString(data []byte, i int) int {
	for i++; i < len(data); i++ {
		switch data[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return len(data) - 1
}

// placeholderSpan is one placeholder object found by findPlaceholders.
type placeholderSpan struct{ start, end, num int }

// scanFrame is an array or object being scanned.
type scanFrame struct {
	start     int
	object    bool
	expectKey bool
	key       byte // 'p' for "_placeholder", 'n' for "num", 0 for any other key
	flag      bool // "_placeholder": true
	numOK     bool
	num       int
}

// findPlaceholders walks valid JSON once and returns the outermost
// placeholder objects ({"_placeholder":true,"num":k}) in order, checking that
// each k is an integer in [0, n). Its cost is linear in len(data): a
// placeholder is recognised from the keys seen while scanning, never by
// decoding the object again.
func findPlaceholders(data []byte, n int) ([]placeholderSpan, error) {
	var stack []scanFrame
	var spans []placeholderSpan
	// value records a scalar or container value for the enclosing object's
	// current key.
	value := func(tok []byte, scalar bool) {
		if len(stack) == 0 {
			return
		}
		f := &stack[len(stack)-1]
		if !f.object {
			return
		}
		switch f.key {
		case 'p':
			f.flag = scalar && string(tok) == "true"
		case 'n':
			f.numOK = false
			if scalar {
				if v, err := strconv.Atoi(string(tok)); err == nil {
					f.num, f.numOK = v, true
				}
			}
		}
	}
	for i := 0; i < len(data); i++ {
		c := data[i]
		switch c {
		case ' ', '\t', '\n', '\r', ':':
		case ',':
			if len(stack) > 0 && stack[len(stack)-1].object {
				stack[len(stack)-1].expectKey = true
			}
		case '"':
			end := skipString(data, i)
			tok := data[i+1 : end]
			if len(stack) > 0 && stack[len(stack)-1].object && stack[len(stack)-1].expectKey {
				f := &stack[len(stack)-1]
				f.expectKey = false
				switch string(tok) {
				case "_placeholder":
					f.key = 'p'
				case "num":
					f.key = 'n'
				default:
					f.key = 0
				}
			} else {
				value(nil, false)
			}
			i = end
		case '{', '[':
			value(nil, false)
			stack = append(stack, scanFrame{start: i, object: c == '{', expectKey: c == '{'})
		case '}', ']':
			if len(stack) == 0 {
				return nil, invalid("unbalanced JSON")
			}
			f := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if f.object && f.flag {
				if !f.numOK || f.num < 0 || f.num >= n {
					return nil, invalid("illegal attachment index (have %d)", n)
				}
				// An enclosing placeholder replaces the ones inside it.
				for len(spans) > 0 && spans[len(spans)-1].start > f.start {
					spans = spans[:len(spans)-1]
				}
				spans = append(spans, placeholderSpan{start: f.start, end: i + 1, num: f.num})
			}
		default:
			j := i
			for j < len(data) && !isDelim(data[j]) {
				j++
			}
			value(data[i:j], true)
			i = j - 1
		}
	}
	if len(stack) != 0 {
		return nil, invalid("unbalanced JSON")
	}
	return spans, nil
}

func isDelim(c byte) bool {
	switch c {
	case ' ', '\t', '\n', '\r', ',', ':', ']', '}', '[', '{', '"':
		return true
	}
	return false
}

// replacePlaceholders returns data with every placeholder replaced by
// repl(num), in one pass. It returns data itself when it holds none.
func replacePlaceholders(data []byte, n int, repl func(dst []byte, num int) []byte) ([]byte, error) {
	spans, err := findPlaceholders(data, n)
	if err != nil {
		return nil, err
	}
	if len(spans) == 0 {
		return data, nil
	}
	out := make([]byte, 0, len(data))
	prev := 0
	for _, s := range spans {
		out = append(out, data[prev:s.start]...)
		out = repl(out, s.num)
		prev = s.end
	}
	return append(out, data[prev:]...), nil
}
