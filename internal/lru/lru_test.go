package lru

import "testing"

func TestLeastRecentlyUsedGoesFirst(t *testing.T) {
	t.Parallel()
	c := New[string, int](3)
	c.Put("a", 1)
	c.Put("b", 2)
	c.Put("c", 3)
	if v, ok := c.Get("a"); !ok || v != 1 { // a is now the most recent
		t.Fatalf("a: %d %v", v, ok)
	}
	c.Put("d", 4) // evicts b, the least recently used
	if _, ok := c.Peek("b"); ok {
		t.Fatal("b kept although it was the least recently used")
	}
	for k, want := range map[string]int{"a": 1, "c": 3, "d": 4} {
		if v, ok := c.Peek(k); !ok || v != want {
			t.Fatalf("%s: %d %v, want %d (the others must survive an eviction)", k, v, ok, want)
		}
	}
	c.Put("c", 30) // an update refreshes c
	c.Put("e", 5)  // evicts a (Peek did not refresh it)
	if _, ok := c.Peek("a"); ok {
		t.Fatal("a kept: Peek changed its recency or the update of c did not")
	}
	if v, _ := c.Peek("c"); v != 30 || c.Len() != 3 {
		t.Fatalf("c=%d len=%d", v, c.Len())
	}
	c.Remove("c")
	c.Remove("nope")
	if _, ok := c.Get("c"); ok || c.Len() != 2 {
		t.Fatalf("after Remove: len %d", c.Len())
	}
	// Many more keys than room: the size stays bounded and the newest stay.
	for i := range 1000 {
		c.Put(string(rune('A'+i)), i)
	}
	if c.Len() != 3 {
		t.Fatalf("len %d", c.Len())
	}
	if v, ok := c.Get(string(rune('A' + 999))); !ok || v != 999 {
		t.Fatal("the newest entry is gone")
	}
}
