package server

import (
	"fmt"
	"math"
	"unicode/utf8"
)

// An admin token is a superuser's password that never expires: it must be
// long and random enough that guessing it online (or offline, from a leaked
// hash) is hopeless.
const (
	minAdminTokenChars = 32
	minAdminTokenBits  = 128
)

// checkAdminToken refuses a JOBLIB_ADMIN_TOKEN shorter than
// minAdminTokenChars characters or estimated below minAdminTokenBits bits
// (secretBits).
func checkAdminToken(token string) error {
	n := utf8.RuneCountInString(token)
	if n < minAdminTokenChars {
		return fmt.Errorf("JOBLIB_ADMIN_TOKEN is %d characters long; it must have at least %d, and %d bits of entropy (e.g. jl_$(openssl rand -hex 24))",
			n, minAdminTokenChars, minAdminTokenBits)
	}
	if bits := secretBits(token); bits < minAdminTokenBits {
		return fmt.Errorf("JOBLIB_ADMIN_TOKEN has about %.0f bits of entropy (repeated or sequential characters count once); it must have at least %d (e.g. jl_$(openssl rand -hex 24))",
			bits, minAdminTokenBits)
	}
	return nil
}

// secretAnalysed bounds the characters secretBits looks at (its cost is at
// worst cubic in them); the rest of a longer secret is not counted.
const secretAnalysed = 256

// secretBits estimates the entropy of a secret in bits, pessimistically for
// what people type and fairly for random strings:
//
//   - the alphabet is the sum of the sizes of the character classes the
//     secret uses: lowercase letters 26, uppercase letters 26, digits 10,
//     other printable ASCII (punctuation, space) 33, anything else 128;
//   - the secret is read left to right as symbols, each worth log2(alphabet)
//     bits: a repeat of at least 3 characters of what came before (also
//     overlapping it, as in "aaaa" or "abcabc") is one symbol, a run of at
//     least 3 characters that step by one code point up or down ("abcd",
//     "4321") is one symbol, any other character is one symbol.
//
// So 48 random hex digits score about 248 bits, and "aaaa...", "abab...",
// "0123456789..." or a short word typed over and over score a few dozen
// whatever their length.
func secretBits(s string) float64 {
	rs := []rune(s)
	if len(rs) > secretAnalysed {
		rs = rs[:secretAnalysed]
	}
	var lower, upper, digit, punct, other bool
	for _, r := range rs {
		switch {
		case 'a' <= r && r <= 'z':
			lower = true
		case 'A' <= r && r <= 'Z':
			upper = true
		case '0' <= r && r <= '9':
			digit = true
		case 0x20 <= r && r < 0x7f:
			punct = true
		default:
			other = true
		}
	}
	alphabet := 0
	for _, c := range []struct {
		used bool
		size int
	}{{lower, 26}, {upper, 26}, {digit, 10}, {punct, 33}, {other, 128}} {
		if c.used {
			alphabet += c.size
		}
	}
	if alphabet < 2 {
		return 0
	}
	symbols := 0
	for i := 0; i < len(rs); symbols++ {
		i += max(1, longestRepeat(rs, i), stepRun(rs, i))
	}
	return float64(symbols) * math.Log2(float64(alphabet))
}

// longestRepeat is the length of the longest prefix of rs[i:] that also
// starts at an earlier position (the copy may overlap it), or 0 when shorter
// than 3.
func longestRepeat(rs []rune, i int) int {
	best := 0
	for j := 0; j < i; j++ {
		n := 0
		for i+n < len(rs) && rs[j+n] == rs[i+n] {
			n++
		}
		best = max(best, n)
	}
	if best < 3 {
		return 0
	}
	return best
}

// stepRun is the length of the run starting at rs[i] whose characters step by
// one code point in one direction, or 0 when shorter than 3.
func stepRun(rs []rune, i int) int {
	if i+2 >= len(rs) {
		return 0
	}
	d := rs[i+1] - rs[i]
	if d != 1 && d != -1 {
		return 0
	}
	n := 2
	for i+n < len(rs) && rs[i+n]-rs[i+n-1] == d {
		n++
	}
	if n < 3 {
		return 0
	}
	return n
}
