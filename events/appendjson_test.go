package events

import (
	"bytes"
	"encoding/json"
	"fmt"
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

// BenchmarkDecodeStatusEvent decodes a task status event as every node's
// listener does for every status change of the deployment, in the form
// PostgreSQL's json_build_object writes it (the hot statements build it in
// SQL).
//
//	go test -run '^$' -bench BenchmarkDecodeStatusEvent ./events/
func BenchmarkDecodeStatusEvent(b *testing.B) {
	payload := []byte(`{"id" : "6f1c2a7e-4b1d-4c39-9a57-0d3f2b8e9c11", "name" : "@global:modifiers:Rotate", "room_id" : "room-7", "status" : "completed", "created_at" : "2026-11-28T02:33:43.123456+00:00", "started_at" : "2026-11-28T02:33:43.223456+00:00", "completed_at" : "2026-11-28T02:33:44.023456+00:00", "queue_position" : null, "worker_id" : "9b2e4c6d-1a3f-4e5b-8c7d-2f1e0a9b8c7d", "error" : null}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode("task_status_event", payload); err != nil {
			b.Fatal(err)
		}
	}
}

// A time in an event decodes as a JSON string parsed as RFC 3339 would, with
// or without escapes in it, in the forms encoding/json and PostgreSQL's
// json_build_object write, and an invalid one fails as it did.
func TestTimeDecodesAsAJSONString(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	layouts := []string{TimeLayout, time.RFC3339Nano, "2006-01-02T15:04:05.999999-07:00", "2006-01-02T15:04:05-07:00"}
	for i := range 5000 {
		when := time.Unix(rng.Int64N(4e10)-1e10, rng.Int64N(1e9)).In(time.FixedZone("z", (rng.IntN(49)-24)*1800))
		s := when.Format(layouts[rng.IntN(len(layouts))])
		if i%9 == 0 && len(s) > 3 { // a broken one
			s = s[:rng.IntN(len(s))] + string([]byte{byte(rng.IntN(256))}) + s[rng.IntN(len(s)):]
		}
		raw, _ := json.Marshal(s)
		if i%4 == 0 { // a character written as an escape, as a JSON writer may
			k := rng.IntN(len(s))
			raw, _ = json.Marshal(s[:k])
			raw = fmt.Appendf(raw[:len(raw)-1], `\u%04x`, s[k])
			tail, _ := json.Marshal(s[k+1:])
			raw = append(raw, tail[1:]...)
		}
		var got Time
		gotErr := got.UnmarshalJSON(raw)
		var str string
		wantErr := json.Unmarshal(raw, &str)
		var want time.Time
		if wantErr == nil {
			want, wantErr = time.Parse(time.RFC3339Nano, str)
		}
		if (gotErr == nil) != (wantErr == nil) || gotErr == nil && !got.Time.Equal(want) {
			t.Fatalf("%s: got %v, %v; want %v, %v", raw, got.Time, gotErr, want, wantErr)
		}
		if gotErr == nil && got.Location() != time.UTC {
			t.Fatalf("%s: decoded in %v, want UTC", raw, got.Location())
		}
	}
}
