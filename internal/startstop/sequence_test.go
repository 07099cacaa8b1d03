package startstop

import (
	"context"
	"errors"
	"slices"
	"testing"
)

// A sequence starts its parts in order and stops them in reverse; a part
// that fails to start stops those already started (and only those), and the
// error names it.
func TestSequenceOrder(t *testing.T) {
	t.Parallel()
	var log []string
	part := func(name string, fail bool) Part {
		return Part{
			Name: name,
			Start: func(context.Context) error {
				log = append(log, "start "+name)
				if fail {
					return errors.New("boom")
				}
				return nil
			},
			Stop: func() { log = append(log, "stop "+name) },
		}
	}
	q := NewSequence(part("db", false), part("bus", false), part("http", false))
	if err := q.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	q.Stop()
	q.Stop() // idempotent
	want := []string{"start db", "start bus", "start http", "stop http", "stop bus", "stop db"}
	if !slices.Equal(log, want) {
		t.Fatalf("order %q, want %q", log, want)
	}

	log = nil
	errBoom := errors.New("boom")
	q = NewSequence(part("db", false), part("bus", false), Part{Name: "lease", Start: func(context.Context) error {
		log = append(log, "start lease")
		return errBoom
	}, Stop: func() { log = append(log, "stop lease") }}, part("http", false))
	err := q.Start(t.Context())
	if !errors.Is(err, errBoom) || err.Error() != "lease: boom" {
		t.Fatalf("error %v, want it to name the part (lease: boom)", err)
	}
	want = []string{"start db", "start bus", "start lease", "stop bus", "stop db"}
	if !slices.Equal(log, want) {
		t.Fatalf("after a failed start %q, want %q", log, want)
	}
	q.Stop()
	if !slices.Equal(log, want) {
		t.Fatalf("Stop after a failed start stopped again: %q", log)
	}
}
