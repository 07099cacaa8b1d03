package server

import (
	"strings"
	"testing"
)

// The admin token check: at least 32 characters and 128 estimated bits,
// where repeats and runs count once; random tokens of the documented shapes
// pass, typed ones do not.
func TestAdminTokenStrength(t *testing.T) {
	t.Parallel()
	weak := map[string]string{
		"admintok":                                "8 characters long",
		strings.Repeat("a", 64):                   "bits of entropy",
		strings.Repeat("ab", 32):                  "bits of entropy",
		strings.Repeat("admintok", 5):             "bits of entropy",
		"0123456789abcdef0123456789abcdef":        "bits of entropy",
		"abcdefghijklmnopqrstuvwxyzABCDEFGHIJ":    "bits of entropy",
		"correcthorsebatterystaplecorrecthorse":   "bits of entropy",
		"jl_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa": "bits of entropy",
	}
	for token, why := range weak {
		if err := checkAdminToken(token); err == nil || !strings.Contains(err.Error(), "JOBLIB_ADMIN_TOKEN") || !strings.Contains(err.Error(), why) {
			t.Errorf("%q: %v", token, err)
		}
	}
	for _, token := range []string{
		"9f86d081884c7d659a2feaa0c55ad015",                 // openssl rand -hex 16
		"jl_5e1cc4797f9d70493f38e7675e2adb67fffca6dd",      // jl_ + openssl rand -hex 20
		"q7Rk2ZpX9wLmN4vT8sYb3HcJ6fDg1AeU",                 // 32 mixed-case alphanumerics
		"jl_e2e_b1c5d4e2-8a35-4c61-9c2f-1e0b7a3d5f68",      // a prefixed UUID
		"Zm9vYmFyYmF6cXV4LXJhbmRvbS1iYXNlNjQtdG9rZW4tdmFs", // base64
	} {
		if err := checkAdminToken(token); err != nil {
			t.Errorf("%q refused: %v", token, err)
		}
	}
	if got := secretBits(strings.Repeat("a", 100000)); got > 20 {
		t.Errorf("a long run scores %.0f bits", got)
	}
}
