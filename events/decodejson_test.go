package events

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

// Whatever the status event's own decoder accepts, it decodes as
// encoding/json does, and it accepts the forms the event's writers produce:
// encoding/json's and PostgreSQL's json_build_object's, whose strings have
// no escapes. Broken variants of both (a byte changed, dropped or added)
// are either decoded as encoding/json decodes them or left to it.
func TestDecodeStatusEventMatchesUnmarshal(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	var fast int
	for i := range 30000 {
		var p []byte
		if i%2 == 0 {
			p = (Emission{Event: randomStatusEvent(rng)}).Payload()
		} else {
			p = postgresForm(rng)
		}
		if i%3 == 0 && len(p) > 0 {
			p = mutate(rng, p)
		}
		if checkDecodeStatusEvent(t, p) {
			fast++
		}
	}
	if fast < 8000 {
		t.Fatalf("the fast decoder took only %d of the events", fast)
	}
	t.Logf("%d of 30000 decoded without encoding/json", fast)
}

// FuzzDecodeStatusEvent runs its seeds in the suite; go test -fuzz
// explores more.
func FuzzDecodeStatusEvent(f *testing.F) {
	rng := rand.New(rand.NewPCG(7, 8))
	for range 20 {
		f.Add(postgresForm(rng))
	}
	for _, s := range []string{`{}`, `{"id":null}`, `{"queue_position":01}`, `{"queue_position":-0}`, `{"queue_position":1e3}`, `{"ID":"x"}`, `{"id":"a","id":"b"}`, `{"error":"x"} x`, `{"created_at":"2026-11-28T02:33:43Z"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, p []byte) { checkDecodeStatusEvent(t, p) })
}

// checkDecodeStatusEvent compares the fast decoder with encoding/json on p
// and reports whether the fast one decoded it.
func checkDecodeStatusEvent(t *testing.T, p []byte) bool {
	t.Helper()
	got, ok := decodeStatusEvent(p)
	if !ok {
		return false
	}
	var want TaskStatusEvent
	if err := json.Unmarshal(p, &want); err != nil {
		t.Fatalf("%s: decoded by the fast decoder, refused by encoding/json: %v", p, err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s:\n got %#v\nwant %#v", p, got, want)
	}
	return true
}

// postgresForm is a status event as json_build_object writes it: a space
// around each colon, after each comma, times with a +00:00 offset.
func postgresForm(rng *rand.Rand) []byte {
	str := func() string {
		parts := []string{"a", "task", "-", ":", "é", "漢字", "🙂", "@global", " ", "0", "/"}
		var b strings.Builder
		for range rng.IntN(6) {
			b.WriteString(parts[rng.IntN(len(parts))])
		}
		q, _ := json.Marshal(b.String())
		return string(q)
	}
	orNull := func(s string) string {
		if rng.IntN(3) == 0 {
			return "null"
		}
		return s
	}
	tm := func() string {
		w := time.Unix(rng.Int64N(4e9), rng.Int64N(1e9)/1000*1000).In(time.FixedZone("", (rng.IntN(5)-2)*3600))
		return `"` + w.Format("2006-01-02T15:04:05.999999-07:00") + `"`
	}
	qp := fmt.Sprint(rng.Int64N(1e6) - 10)
	return fmt.Appendf(nil, `{"id" : %s, "name" : %s, "room_id" : %s, "status" : %s, "created_at" : %s, "started_at" : %s, "completed_at" : %s, "queue_position" : %s, "worker_id" : %s, "error" : %s}`,
		str(), str(), str(), str(), tm(), orNull(tm()), orNull(tm()), orNull(qp), orNull(str()), orNull(str()))
}

// mutate changes, drops or adds one byte of p.
func mutate(rng *rand.Rand, p []byte) []byte {
	k := rng.IntN(len(p))
	c := []byte(`"\:,{} -0.e1nx` + "\xff")[rng.IntN(15)]
	switch rng.IntN(3) {
	case 0:
		q := append([]byte(nil), p...)
		q[k] = c
		return q
	case 1:
		return append(append([]byte(nil), p[:k]...), p[k+1:]...)
	default:
		return append(append(append([]byte(nil), p[:k]...), c), p[k:]...)
	}
}
