package server

import (
	"testing"
	"time"
)

// test_router_task_status.py test_parse_prefer_wait_various_formats: the
// first wait=<digits> token of a Prefer header, on word boundaries; anything
// else means no wait.
func TestParsePreferWait(t *testing.T) {
	t.Parallel()
	cases := []struct {
		header string
		wait   time.Duration
		ok     bool
	}{
		{"", 0, false},
		{"wait=30", 30 * time.Second, true},
		{"wait=0", 0, true},
		{"wait=30, respond-async", 30 * time.Second, true},
		{"respond-async, wait=60", 60 * time.Second, true},
		{"respond-async", 0, false},
		{"wait=abc", 0, false},
		{"wait=5abc", 0, false},
		{"wait=5, wait=9", 5 * time.Second, true},
		{"Wait=5", 0, false}, // case-sensitive, like the contract
	}
	for _, c := range cases {
		wait, ok := parsePreferWait(c.header)
		if wait != c.wait || ok != c.ok {
			t.Errorf("parsePreferWait(%q) = %s, %v; want %s, %v", c.header, wait, ok, c.wait, c.ok)
		}
	}
}
