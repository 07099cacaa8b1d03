package wire

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

// The fuzz targets run their seed corpus as ordinary tests; `go test -fuzz=FuzzX`
// explores further. Every decoder must never panic, and whatever it accepts must
// survive an encode/decode round trip unchanged.

func FuzzDecodeEIO(f *testing.F) {
	for _, s := range []string{"", "0", `0{"sid":"a"}`, "1", "2", "2probe", "3probe", "4", "4hello", "5", "6", "7", "b", "\x00", "4\x1e"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		p, err := DecodeEIO(in)
		if err != nil {
			return
		}
		enc := AppendEIO(nil, p)
		if !bytes.Equal(enc, in) {
			t.Fatalf("round trip %q -> %q", in, enc)
		}
	})
}

func FuzzDecodePayload(f *testing.F) {
	for _, s := range []string{"", "4hello", "4a\x1e4b", "bAQIDBA==", "b", "4a\x1e", "\x1e", "bAQ", "b====", "40\x1e42[\"x\"]\x1ebAA==", "2\x1e3\x1e6"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		pkts, err := DecodePayload(in)
		if err != nil {
			return
		}
		enc := AppendPayload(nil, pkts)
		again, err := DecodePayload(enc)
		if err != nil {
			t.Fatalf("re-decode %q: %v", enc, err)
		}
		if len(again) != len(pkts) {
			t.Fatalf("round trip changed the packet count: %d -> %d", len(pkts), len(again))
		}
		for i := range pkts {
			if pkts[i].Type != again[i].Type || pkts[i].Binary != again[i].Binary || !bytes.Equal(pkts[i].Data, again[i].Data) {
				t.Fatalf("round trip changed packet %d: %+v -> %+v", i, pkts[i], again[i])
			}
		}
	})
}

func FuzzDecodeSIO(f *testing.F) {
	for _, s := range []string{
		"0", "0{}", `0{"token":"x"}`, "0/admin,", "0/admin", `0/admin,{"a":1}`, "1", "1/a,", "1{}",
		`2["a"]`, `20["a",1]`, `2/n,7["a",{"b":[1,2]}]`, `2["connect"]`, `2[1]`, `2[]`, `2abc["a"]`,
		`3[]`, `30[1,"2",{"3":[true]}]`, `4{"message":"x"}`, `4"x"`,
		`51-["a",{"_placeholder":true,"num":0}]`, `61-0[{"_placeholder":true,"num":0}]`, `5-["a"]`,
		"7", "", "2", `299999999999999999999["a"]`, `2["a"`, `0/` + "\x00" + `,{}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		p, err := DecodeSIO(in)
		if err != nil {
			return
		}
		enc := AppendSIO(nil, p)
		q, err := DecodeSIO(enc)
		if err != nil {
			t.Fatalf("re-decode %q (from %q): %v", enc, in, err)
		}
		if !reflect.DeepEqual(p, q) {
			t.Fatalf("round trip %q: %+v -> %+v", in, p, q)
		}
		if p.Type == SIOEvent || p.Type == SIOBinaryEvent {
			if _, _, err := SplitEvent(p.Data); err != nil {
				t.Fatalf("accepted event %q but SplitEvent fails: %v", in, err)
			}
		}
	})
}

func FuzzReconstruct(f *testing.F) {
	for _, s := range []string{
		`[]`, `["a",{"_placeholder":true,"num":0}]`, `[{"_placeholder":true,"num":1}]`,
		`{"x":[{"_placeholder":true,"num":0},{"y":{"_placeholder":true,"num":0}}]}`,
		`[{"_placeholder":false,"num":9}]`, `[{"_placeholder":true,"num":-1}]`, `[{"_placeholder":true,"num":1e0}]`,
		`"str"`, `1`, `null`, `[`, `{"_placeholder":true}`,
	} {
		f.Add([]byte(s), uint8(1))
	}
	f.Fuzz(func(t *testing.T, in []byte, n uint8) {
		atts := make([][]byte, n%4)
		for i := range atts {
			atts[i] = []byte{byte(i), 0xff}
		}
		checkErr := CheckPlaceholders(in, len(atts))
		inlined, err := InlineAttachments(in, atts)
		if (err == nil) != (checkErr == nil) {
			t.Fatalf("CheckPlaceholders and InlineAttachments disagree on %q: %v vs %v", in, checkErr, err)
		}
		if err != nil {
			return
		}
		if !json.Valid(inlined) {
			t.Fatalf("InlineAttachments(%q) produced invalid JSON %q", in, inlined)
		}
		v, err := Reconstruct(in, atts)
		if err != nil {
			t.Fatalf("Reconstruct(%q) failed after CheckPlaceholders passed: %v", in, err)
		}
		// Deconstructing the reconstructed value yields no placeholder that points
		// outside the collected attachments.
		var back [][]byte
		data, err := json.Marshal(Deconstruct(v, &back))
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		if err := CheckPlaceholders(data, len(back)); err != nil {
			t.Fatalf("Deconstruct(Reconstruct(%q)) = %s: %v", in, data, err)
		}
	})
}
