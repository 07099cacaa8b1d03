package events

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// Whatever the wire batch decoder accepts, it decodes as encoding/json does,
// and it accepts the batches the writers produce: the frames the hot
// statements fill in (PGBus.Frame), encodeBatch's numbered batches of any
// events, and spill references. Broken variants (a byte changed, dropped
// or added) are either decoded as encoding/json decodes them or left to it.
func TestDecodeWireMatchesUnmarshal(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	var fast, unbroken, whole int
	for i := range 20000 {
		b := randomWire(rng)
		mutated := i%3 == 0
		if mutated {
			b = mutate(rng, b)
		} else {
			unbroken++
		}
		if checkDecodeWire(t, b) {
			fast++
			if !mutated {
				whole++
			}
		}
	}
	// Every unbroken batch goes the fast way.
	if whole != unbroken {
		t.Fatalf("the fast decoder took %d of %d unbroken batches", whole, unbroken)
	}
	t.Logf("%d of 20000 decoded without encoding/json", fast)
}

// FuzzDecodeWire runs its seeds in the suite; go test -fuzz explores more.
func FuzzDecodeWire(f *testing.F) {
	rng := rand.New(rand.NewPCG(13, 14))
	for range 20 {
		f.Add(randomWire(rng))
	}
	for _, s := range []string{`{}`, `{"e":[]}`, `{"e":[{}]}`, `{"e":null}`, `{"N":"x"}`, `{"n":"a","n":"b"}`,
		`{"e":[{"r":"a","t":"x"}],"e":[{"r":"b"}]}`, `{"e":[{"p":1,"p":2}]}`, `{"s":-1}`, `{"s":01}`, `{"i":1e3}`,
		`{"e":[{"p":"\ud83d"}]}`, `{"e":[{"p":[1,{"a":[true,false,null]},-0.5e+3]}]}`, `{"e":[{"p":01}]}`, `{"e":[{"p":"\x"}]}`,
		`{"at":-0}`, `{"ref":9223372036854775808}`, `{"s":18446744073709551616}`, `{"n":"x"} x`, `{"e":[{"p":{"a" 1}}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkDecodeWire(t, b) })
}

// checkDecodeWire compares the fast decoder with encoding/json on b and
// reports whether the fast one decoded it.
func checkDecodeWire(t *testing.T, b []byte) bool {
	t.Helper()
	got, ok := decodeWireBatch(b)
	var want wireBatch
	werr := json.Unmarshal(b, &want)
	if !ok {
		// decodeWire falls back to encoding/json, error included.
		fb, err := decodeWire(b)
		if (err == nil) != (werr == nil) || err == nil && !reflect.DeepEqual(fb, want) {
			t.Fatalf("%s: decodeWire %#v, %v; encoding/json %#v, %v", b, fb, err, want, werr)
		}
		return false
	}
	if werr != nil {
		t.Fatalf("%s: decoded by the fast decoder, refused by encoding/json: %v", b, werr)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s:\n got %#v\nwant %#v", b, got, want)
	}
	return true
}

// randomWire is a batch as one of its writers produces it.
func randomWire(rng *rand.Rand) []byte {
	rooms := []string{"room:a", "room:@global", "jobs:room:cat:name", "room:漢字", "room:a b", "task:1"}
	switch rng.IntN(3) {
	case 0:
		// A hot statement's frame around the items of one or more
		// json_build_object payloads.
		names := []string{"n1", "node-2", "é"}
		f := testFrame(names[rng.IntN(len(names))], "public", uint64(rng.Int64N(1e12)), "task_status_event")
		items := make([]string, 1+rng.IntN(4))
		for i := range items {
			room, _ := json.Marshal(rooms[rng.IntN(len(rooms))])
			items[i] = f.Item(string(room), string(postgresForm(rng)))
		}
		return []byte(f.Payload(items...))
	case 1:
		ems := make([]Emission, rng.IntN(4))
		for i := range ems {
			var ev Event = randomStatusEvent(rng)
			switch rng.IntN(4) {
			case 0:
				ev = JobsInvalidate{}
			case 1:
				ev = TaskAvailable{JobName: "room:" + strings.Repeat("x", rng.IntN(5)), RoomID: "room", TaskID: "t"}
			}
			ems[i] = Emission{Room: rooms[rng.IntN(len(rooms))], Event: ev}
		}
		b, err := encodeBatch("node", "public", uint64(rng.Int64N(1e15)), ems)
		if err != nil {
			panic(err)
		}
		return b
	default:
		b, _ := json.Marshal(wireBatch{Node: "node", Scope: "s", Ref: rng.Int64N(1e9) + 1})
		return b
	}
}

// testFrame is PGBus.Frame's frame for a node run, scope and statement id.
func testFrame(node, scope string, id uint64, event string) NotifyFrame {
	b := &PGBus{node: node, scope: scope}
	b.ids.Store(id - 1)
	return b.Frame(event)
}

// The fast path reads a statement's status event batch at a fraction of
// encoding/json's cost: go test -run '^$' -bench DecodeWire ./events.
func BenchmarkDecodeWire(b *testing.B) {
	rng := rand.New(rand.NewPCG(15, 16))
	f := testFrame("node-1", "public", 42, "task_status_event")
	msg := []byte(f.Payload(f.Item(`"room:bench"`, string(postgresForm(rng)))))
	b.Run("fast", func(b *testing.B) {
		for b.Loop() {
			if _, err := decodeWire(msg); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		for b.Loop() {
			var w wireBatch
			if err := json.Unmarshal(msg, &w); err != nil {
				b.Fatal(err)
			}
		}
	})
}
