// Package lru is a bounded map that drops its least recently used entry
// when full: Get, Put and Remove are O(1). It is not safe for concurrent
// use; callers hold their own lock (they usually guard more than the map).
package lru

// Cache maps keys to values, holding at most its capacity. The zero value is
// not usable: build one with New.
type Cache[K comparable, V any] struct {
	max   int
	items map[K]*node[K, V]
	root  node[K, V] // sentinel: root.next is the most recent, root.prev the least
}

type node[K comparable, V any] struct {
	key        K
	val        V
	prev, next *node[K, V]
}

// New returns an empty cache holding at most size entries (at least 1).
func New[K comparable, V any](size int) *Cache[K, V] {
	c := &Cache[K, V]{max: max(1, size), items: map[K]*node[K, V]{}}
	c.root.next, c.root.prev = &c.root, &c.root
	return c
}

// Get returns the value of key and marks it as the most recently used.
func (c *Cache[K, V]) Get(key K) (V, bool) {
	n, ok := c.items[key]
	if !ok {
		var zero V
		return zero, false
	}
	c.moveToFront(n)
	return n.val, true
}

// Peek returns the value of key without changing its recency.
func (c *Cache[K, V]) Peek(key K) (V, bool) {
	n, ok := c.items[key]
	if !ok {
		var zero V
		return zero, false
	}
	return n.val, true
}

// Put sets key's value and marks it as the most recently used; when the
// cache is full, the least recently used entry goes first.
func (c *Cache[K, V]) Put(key K, val V) {
	if n, ok := c.items[key]; ok {
		n.val = val
		c.moveToFront(n)
		return
	}
	var n *node[K, V]
	if len(c.items) >= c.max {
		// Reuse the evicted node: a full cache allocates nothing more.
		n = c.root.prev
		c.unlink(n)
		delete(c.items, n.key)
		*n = node[K, V]{}
	} else {
		n = &node[K, V]{}
	}
	n.key, n.val = key, val
	c.items[key] = n
	c.pushFront(n)
}

// Remove deletes key.
func (c *Cache[K, V]) Remove(key K) {
	if n, ok := c.items[key]; ok {
		c.unlink(n)
		delete(c.items, key)
	}
}

// Len is the number of entries.
func (c *Cache[K, V]) Len() int { return len(c.items) }

func (c *Cache[K, V]) unlink(n *node[K, V]) {
	n.prev.next, n.next.prev = n.next, n.prev
	n.prev, n.next = nil, nil
}

func (c *Cache[K, V]) pushFront(n *node[K, V]) {
	n.prev, n.next = &c.root, c.root.next
	c.root.next.prev = n
	c.root.next = n
}

func (c *Cache[K, V]) moveToFront(n *node[K, V]) {
	if c.root.next == n {
		return
	}
	c.unlink(n)
	c.pushFront(n)
}
