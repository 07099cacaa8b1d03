package jsonguard

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	cases := []struct {
		name string
		in   string
		want error
	}{
		{"plain", `{"a":[1,2,{"b":"c"}],"d":-1.5e10}`, nil},
		{"depth at budget", deep(64), nil},
		{"depth past budget", deep(65), ErrTooDeep},
		{"brackets in strings do not count", `{"a":"` + strings.Repeat("[", 100) + `"}`, nil},
		{"escaped quote keeps the string open", `{"a":"\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}`, nil},
		{"valid UTF-8", `{"a":"héllo ☃ 😀"}`, nil},
		{"invalid UTF-8 in string", "{\"a\":\"\xff\"}", ErrInvalidUTF8},
		{"truncated UTF-8 in string", "{\"a\":\"\xe2\x98\"}", ErrInvalidUTF8},
		{"invalid UTF-8 outside string", "{\"a\":1}\xff", ErrInvalidUTF8},
		{"NUL escape", `{"a":"x\u0000y"}`, ErrNUL},
		{"NUL escape in key", `{"\u0000":1}`, ErrNUL},
		{"escaped backslash before u0000 text", `{"a":"\\u0000"}`, nil},
		{"surrogate pair", `{"a":"\ud83d\ude00"}`, nil},
		{"lone high surrogate", `{"a":"\ud83d"}`, ErrSurrogate},
		{"high surrogate then other escape", `{"a":"\ud83d\u0041"}`, ErrSurrogate},
		{"lone low surrogate", `{"a":"\ude00"}`, ErrSurrogate},
		{"big exponent", `{"a":1e400}`, nil},
		{"exponent past budget", `{"a":1e10001}`, ErrNumber},
		{"negative exponent past budget", `{"a":1E-99999999999999999999}`, ErrNumber},
		{"too many digits", `{"a":` + strings.Repeat("9", 4301) + `}`, ErrNumber},
		{"digits at budget", `{"a":` + strings.Repeat("9", 4300) + `}`, nil},
	}
	for _, c := range cases {
		err := Check([]byte(c.in), 0)
		if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("%s: Check = %v, want %v", c.name, err, c.want)
		}
		var e *Error
		if err != nil && !errors.As(err, &e) {
			t.Errorf("%s: error %T is not *Error", c.name, err)
		}
	}
}

func TestDepth(t *testing.T) {
	t.Parallel()
	if err := Depth([]byte(`[{"a":[`+"\"]]]]\""+`]}]`), 3); err != nil {
		t.Fatal(err)
	}
	if err := Depth([]byte(`[[[[`), 3); !errors.Is(err, ErrTooDeep) {
		t.Fatalf("Depth = %v, want ErrTooDeep", err)
	}
	if err := Check([]byte(`[[[[]]]]`), 3); !errors.Is(err, ErrTooDeep) || !strings.Contains(err.Error(), "more than 3 levels") {
		t.Fatalf("Check = %v", err)
	}
}

// Check's cost is linear whatever the shape: 10,000 levels of nesting (the
// shape that made workers' decoders crash) cost no more per byte than a
// flat document, and it allocates nothing.
func TestCheckAllocatesNothing(t *testing.T) {
	deep := []byte(strings.Repeat(`{"a":`, 10000) + "1" + strings.Repeat("}", 10000))
	allocs := testing.AllocsPerRun(10, func() { _ = Check(deep, 1<<30) })
	if allocs != 0 {
		t.Fatalf("Check allocated %v times", allocs)
	}
}

// Whatever Check accepts and encoding/json accepts is JSON the decoder can
// read; Check never panics.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":"\ud83d\ude00"}`, `[[[]]]`, `"\u00`, `1e99999`, "\"\xff", `"\\`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		err := Check(b, 8)
		if err == nil && json.Valid(b) {
			var v any
			if uerr := json.Unmarshal(b, &v); uerr != nil {
				t.Fatalf("valid JSON %q did not decode: %v", b, uerr)
			}
		}
	})
}

func BenchmarkCheck(b *testing.B) {
	doc := []byte(strings.Repeat(`{"key":"value \u00e9 ☃","n":[1,2.5e3,-7]},`, 20000))
	b.SetBytes(int64(len(doc)))
	for b.Loop() {
		_ = Check(doc, 64)
	}
}
