package events

import "testing"

// TestOffsetNamer: the batches of one statement (same node and id) get
// distinct ranks even when other batches come between them, and each
// emission of a batch its own index; batches without a number get none.
func TestOffsetNamer(t *testing.T) {
	var n offsetNamer
	name := func(b wireBatch, items int) []string {
		ems := make([]Emission, items)
		n.name(b, ems)
		out := make([]string, items)
		for i, e := range ems {
			out[i] = e.Offset
		}
		return out
	}
	x := wireBatch{Node: "a", ID: 7}
	got := [][]string{
		name(x, 1),
		name(wireBatch{Node: "b", ID: 7}, 1),
		name(x, 1),
		name(wireBatch{Node: "a", Seq: 7}, 2),
		name(wireBatch{Node: "a"}, 1),
	}
	seen := map[string]bool{}
	for i, offs := range got[:4] {
		for _, o := range offs {
			if o == "" || seen[o] {
				t.Fatalf("batch %d: offset %q empty or repeated (%v)", i, o, got)
			}
			seen[o] = true
		}
	}
	if got[4][0] != "" {
		t.Fatalf("an unnumbered batch got offset %q", got[4][0])
	}
	// Another node that receives the same batches names them alike.
	var m offsetNamer
	for i, b := range []wireBatch{x, {Node: "b", ID: 7}, x} {
		ems := make([]Emission, 1)
		m.name(b, ems)
		if ems[0].Offset != got[i][0] {
			t.Fatalf("batch %d named %q and %q", i, ems[0].Offset, got[i][0])
		}
	}
}
