package events

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"
	"time"
)

// TestAppendJSONMatchesMarshal: sockets and other nodes get the status
// event's hand-written JSON; it must be encoding/json's, byte for byte, for
// any strings (control characters, quotes, HTML characters, U+2028, invalid
// UTF-8), any times (zero, other zones, sub-microsecond) and null or set
// pointers.
func TestAppendJSONMatchesMarshal(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		ev := randomStatusEvent(rng)
		checkAppendJSON(t, ev)
		if t.Failed() {
			t.Fatalf("case %d: %#v", i, ev)
		}
	}
}

// FuzzAppendJSON runs its seeds in the suite; go test -fuzz explores more.
func FuzzAppendJSON(f *testing.F) {
	for _, s := range []string{"", "plain", "<a href=\"x\">&amp;</a>", "\x00\x01\x1f\x7f", "\b\f\n\r\t\\", "\u2028\u2029", "\xff\xfe", "é漢字🙂", "a\xc3"} {
		f.Add(s, int64(0))
	}
	f.Fuzz(func(t *testing.T, s string, n int64) {
		when := Time{time.Unix(n%1e12, n%1e9)}
		checkAppendJSON(t, TaskStatusEvent{ID: s, Name: s + "x", RoomID: s, Status: s, CreatedAt: when, QueuePosition: &n, WorkerID: &s, Error: &s})
	})
}

func checkAppendJSON(t *testing.T, ev TaskStatusEvent) {
	t.Helper()
	want, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	if got := (Emission{Event: ev}).Payload(); !bytes.Equal(got, want) {
		t.Errorf("appendJSON\n got %s\nwant %s", got, want)
	}
}

func randomStatusEvent(rng *rand.Rand) TaskStatusEvent {
	str := func() string {
		var b []byte
		for range rng.IntN(12) {
			switch rng.IntN(6) {
			case 0: // any byte, valid UTF-8 or not
				b = append(b, byte(rng.IntN(256)))
			case 1:
				special := []string{`"`, `\`, "<", ">", "&", "\u2028", "\u2029", "\x7f", "\u00e9"}
				b = append(b, special[rng.IntN(len(special))]...)
			case 2:
				b = append(b, string(rune(rng.IntN(0x30000)))...)
			default:
				b = append(b, byte(0x20+rng.IntN(0x5f)))
			}
		}
		return string(b)
	}
	ptr := func() *string {
		if rng.IntN(3) == 0 {
			return nil
		}
		s := str()
		return &s
	}
	tm := func() Time {
		if rng.IntN(4) == 0 {
			return Time{}
		}
		zone := time.FixedZone("z", (rng.IntN(49)-24)*1800)
		return Time{time.Unix(rng.Int64N(4e10)-1e10, rng.Int64N(1e9)).In(zone)}
	}
	ev := TaskStatusEvent{ID: str(), Name: str(), RoomID: str(), Status: str(), CreatedAt: tm(), StartedAt: tm(), CompletedAt: tm(), WorkerID: ptr(), Error: ptr()}
	if rng.IntN(2) == 0 {
		q := rng.Int64() - rng.Int64()
		ev.QueuePosition = &q
	}
	return ev
}
