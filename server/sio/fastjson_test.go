package sio

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"
)

// An event whose arguments are JSON and strings is written without
// encoding/json, and its packet is byte for byte the one encoding/json
// writes: for JSON in encoding/json's own form, and for JSON that is not
// (indented, with HTML characters, U+2028, invalid UTF-8), which goes
// through encoding/json.
func TestEventPacketMatchesEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 28))
	pieces := []string{"a", "Zürich", "<b>", "x&y", "\u2028", "\u2029", "\"", "\\", "\n", "\x01", "\xff", "✓", " ", "task:1", "\ufffd"}
	str := func() string {
		var b []byte
		for range rng.IntN(5) {
			b = append(b, pieces[rng.IntN(len(pieces))]...)
		}
		return string(b)
	}
	var fast int
	for i := range 20000 {
		v := map[string]any{"id": str(), "n": rng.IntN(1000), "ok": rng.IntN(2) == 0, "err": nil, "list": []any{str(), 1.5}}
		payload, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if i%5 == 0 {
			payload, _ = json.MarshalIndent(v, "", " ")
		}
		if i%7 == 0 && len(payload) > 2 { // raw bytes encoding/json would escape, inside a string
			payload = append(append([]byte(`{"s":"`), str()...), `"}`...)
			if !json.Valid(payload) {
				continue
			}
		}
		event, offset := "task_status_event", str()
		if i%3 == 0 {
			event = str()
		}
		args := []any{JSON(payload), offset}
		got, atts, err := eventData(event, args)
		if err != nil || len(atts) != 0 {
			t.Fatalf("event %q, payload %q: %d attachments, %v", event, payload, len(atts), err)
		}
		want, err := json.Marshal([]any{event, json.RawMessage(payload), offset})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("event %q, payload %q, offset %q:\n got %s\nwant %s", event, payload, offset, got, want)
		}
		if _, ok := appendArgsJSON(nil, event, args); ok {
			fast++
		}
	}
	if fast < 2000 {
		t.Fatalf("only %d of the events took the fast path", fast)
	}
	t.Logf("%d events written without encoding/json", fast)
}

// BenchmarkEventPacket builds the packet of a task status event with its
// recovery offset, as every node does for every event it delivers: the
// payload as JSON (written directly) and as a json.RawMessage (through
// encoding/json, as before).
//
//	go test -run '^$' -bench BenchmarkEventPacket ./server/sio/
func BenchmarkEventPacket(b *testing.B) {
	payload := []byte(`{"id":"6f1c2a7e-4b1d-4c39-9a57-0d3f2b8e9c11","name":"@global:modifiers:Rotate","room_id":"room-7","status":"running","created_at":"2026-11-28T02:33:43.123456Z","started_at":"2026-11-28T02:33:43.223456Z","completed_at":null,"queue_position":null,"worker_id":"9b2e4c6d-1a3f-4e5b-8c7d-2f1e0a9b8c7d","error":null}`)
	const offset = "n1a2b3c4:1700000000:42:0:0"
	for _, c := range []struct {
		name string
		arg  any
	}{{"json", JSON(payload)}, {"raw-message", json.RawMessage(payload)}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := encodeEventSize("/", "task_status_event", []any{c.arg, offset}, 0, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
