package main

import (
	"slices"
	"testing"
)

// serve's parts start in an order an operator relies on, and stop in the
// reverse (internal/startstop's TestSequenceOrder): each part may use what
// started before it until it has stopped itself.
func TestServePartsOrder(t *testing.T) {
	t.Parallel()
	var names []string
	for _, p := range (&process{}).serveParts() {
		names = append(names, p.Name)
	}
	at := func(name string) int {
		i := slices.Index(names, name)
		if i < 0 {
			t.Fatalf("no part %q in %q", name, names)
		}
		return i
	}
	before := [][2]string{
		// A busy port changes nothing: the database is not created or
		// migrated before the listener is bound.
		{"listener", "database"},
		{"database", "event bus"},
		// The service is closed (detached from the bus) before the bus stops.
		{"event bus", "service"},
		{"service", "internal jobs"},
		{"internal jobs", "service loops"},
		{"service loops", "node recovery"},
		{"sweeper", "sockets"},
		{"sockets", "metrics endpoint"},
		// A fresh database's admin token is made last before the lease: a
		// token made before a failed start would be lost (it is shown once).
		{"admin", "node lease"},
		// The lease stops after the HTTP drain; it needs the sockets
		// (a lost lease closes them).
		{"sockets", "node lease"},
		{"node lease", "http"},
	}
	for _, b := range before {
		if at(b[0]) >= at(b[1]) {
			t.Errorf("%s must start before %s (and stop after it): %q", b[0], b[1], names)
		}
	}
	if names[len(names)-1] != "http" {
		t.Errorf("serving must start last and stop first (its drain closes the sockets): %q", names)
	}
}
