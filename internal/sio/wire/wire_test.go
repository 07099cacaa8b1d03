package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

func TestDecodeEIO(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in      string
		want    EIOPacket
		wantErr bool
	}{
		{in: "2", want: EIOPacket{Type: EIOPing, Data: []byte{}}},
		{in: "2probe", want: EIOPacket{Type: EIOPing, Data: []byte("probe")}},
		{in: "3probe", want: EIOPacket{Type: EIOPong, Data: []byte("probe")}},
		{in: `40{"sid":"x"}`, want: EIOPacket{Type: EIOMessage, Data: []byte(`0{"sid":"x"}`)}},
		{in: "6", want: EIOPacket{Type: EIONoop, Data: []byte{}}},
		{in: "", wantErr: true},
		{in: "7", wantErr: true},
		{in: "a", wantErr: true},
		{in: "b4=", wantErr: true},
	}
	for _, tc := range cases {
		got, err := DecodeEIO([]byte(tc.in))
		if tc.wantErr {
			if !errors.Is(err, ErrInvalidPacket) {
				t.Errorf("DecodeEIO(%q) err = %v, want ErrInvalidPacket", tc.in, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("DecodeEIO(%q): %v", tc.in, err)
			continue
		}
		if got.Type != tc.want.Type || !bytes.Equal(got.Data, tc.want.Data) || got.Binary {
			t.Errorf("DecodeEIO(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
		if enc := AppendEIO(nil, got); string(enc) != tc.in {
			t.Errorf("AppendEIO(DecodeEIO(%q)) = %q", tc.in, enc)
		}
	}
}

func TestPayload(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in      string
		want    []EIOPacket
		wantErr bool
	}{
		{in: "4hello", want: []EIOPacket{{Type: EIOMessage, Data: []byte("hello")}}},
		{in: "4hello\x1e2\x1e40", want: []EIOPacket{
			{Type: EIOMessage, Data: []byte("hello")},
			{Type: EIOPing, Data: []byte{}},
			{Type: EIOMessage, Data: []byte("0")},
		}},
		{in: "bAQIDBA==", want: []EIOPacket{{Type: EIOMessage, Data: []byte{1, 2, 3, 4}, Binary: true}}},
		{in: "451-[\"x\",{\"_placeholder\":true,\"num\":0}]\x1ebAQI=", want: []EIOPacket{
			{Type: EIOMessage, Data: []byte(`51-["x",{"_placeholder":true,"num":0}]`)},
			{Type: EIOMessage, Data: []byte{1, 2}, Binary: true},
		}},
		{in: "b", want: []EIOPacket{{Type: EIOMessage, Data: []byte{}, Binary: true}}},
		{in: "", wantErr: true},
		{in: "4a\x1e", wantErr: true},
		{in: "\x1e4a", wantErr: true},
		{in: "4a\x1e\x1e4b", wantErr: true},
		{in: "b!!!", wantErr: true},
		{in: "bAQ", wantErr: true},
		{in: "9", wantErr: true},
	}
	for _, tc := range cases {
		got, err := DecodePayload([]byte(tc.in))
		if tc.wantErr {
			if !errors.Is(err, ErrInvalidPacket) {
				t.Errorf("DecodePayload(%q) err = %v, want ErrInvalidPacket", tc.in, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("DecodePayload(%q): %v", tc.in, err)
			continue
		}
		if len(got) != len(tc.want) {
			t.Fatalf("DecodePayload(%q) = %d packets, want %d", tc.in, len(got), len(tc.want))
		}
		for i := range got {
			if got[i].Type != tc.want[i].Type || got[i].Binary != tc.want[i].Binary || !bytes.Equal(got[i].Data, tc.want[i].Data) {
				t.Errorf("DecodePayload(%q)[%d] = %+v, want %+v", tc.in, i, got[i], tc.want[i])
			}
		}
		if enc := AppendPayload(nil, got); string(enc) != tc.in {
			t.Errorf("AppendPayload(DecodePayload(%q)) = %q", tc.in, enc)
		}
	}
}

func TestDecodeSIO(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in      string
		want    SIOPacket
		wantErr bool
		// canonical is the re-encoding when it differs from in.
		canonical string
	}{
		{in: "0", want: SIOPacket{Type: SIOConnect, Namespace: "/"}},
		{in: "0{}", want: SIOPacket{Type: SIOConnect, Namespace: "/", Data: json.RawMessage(`{}`)}},
		{in: `0{"token":"py"}`, want: SIOPacket{Type: SIOConnect, Namespace: "/", Data: json.RawMessage(`{"token":"py"}`)}},
		{in: `0/custom,{"token":"abc"}`, want: SIOPacket{Type: SIOConnect, Namespace: "/custom", Data: json.RawMessage(`{"token":"abc"}`)}},
		{in: "0/random", want: SIOPacket{Type: SIOConnect, Namespace: "/random"}, canonical: "0/random,"},
		{in: "1", want: SIOPacket{Type: SIODisconnect, Namespace: "/"}},
		{in: "1/admin,", want: SIOPacket{Type: SIODisconnect, Namespace: "/admin"}},
		{in: `2["hey","Jude"]`, want: SIOPacket{Type: SIOEvent, Namespace: "/", Data: json.RawMessage(`["hey","Jude"]`)}},
		{in: `20["echo",{"n":3}]`, want: SIOPacket{Type: SIOEvent, Namespace: "/", HasID: true, ID: 0, Data: json.RawMessage(`["echo",{"n":3}]`)}},
		{in: `212["x"]`, want: SIOPacket{Type: SIOEvent, Namespace: "/", HasID: true, ID: 12, Data: json.RawMessage(`["x"]`)}},
		{in: `30[{"n":3}]`, want: SIOPacket{Type: SIOAck, Namespace: "/", HasID: true, Data: json.RawMessage(`[{"n":3}]`)}},
		{in: `3/admin,13["bar"]`, want: SIOPacket{Type: SIOAck, Namespace: "/admin", HasID: true, ID: 13, Data: json.RawMessage(`["bar"]`)}},
		{in: `30[]`, want: SIOPacket{Type: SIOAck, Namespace: "/", HasID: true, Data: json.RawMessage(`[]`)}},
		{in: `4{"message":"no"}`, want: SIOPacket{Type: SIOConnectError, Namespace: "/", Data: json.RawMessage(`{"message":"no"}`)}},
		{in: `4"no"`, want: SIOPacket{Type: SIOConnectError, Namespace: "/", Data: json.RawMessage(`"no"`)}},
		{in: `51-1["echo",{"_placeholder":true,"num":0}]`, want: SIOPacket{Type: SIOBinaryEvent, Namespace: "/", Attachments: 1, HasID: true, ID: 1, Data: json.RawMessage(`["echo",{"_placeholder":true,"num":0}]`)}},
		{in: `61-1[{"_placeholder":true,"num":0}]`, want: SIOPacket{Type: SIOBinaryAck, Namespace: "/", Attachments: 1, HasID: true, ID: 1, Data: json.RawMessage(`[{"_placeholder":true,"num":0}]`)}},
		{in: `52-/nsp,["a",{"_placeholder":true,"num":0},{"_placeholder":true,"num":1}]`, want: SIOPacket{Type: SIOBinaryEvent, Namespace: "/nsp", Attachments: 2, Data: json.RawMessage(`["a",{"_placeholder":true,"num":0},{"_placeholder":true,"num":1}]`)}},

		{in: "", wantErr: true},
		{in: "7", wantErr: true},
		{in: "abc", wantErr: true},
		{in: "1{}", wantErr: true},               // DISCONNECT with payload
		{in: "0[]", wantErr: true},               // CONNECT payload must be an object
		{in: `0"x"`, wantErr: true},              // ... not a string
		{in: `2{"abc":1}`, wantErr: true},        // EVENT payload must be an array
		{in: `2[]`, wantErr: true},               // ... non-empty
		{in: `2[1]`, wantErr: true},              // ... with a string name
		{in: `2["connect"]`, wantErr: true},      // ... not reserved
		{in: `2["disconnect",1]`, wantErr: true}, // ... not reserved
		{in: `2`, wantErr: true},                 // EVENT without payload
		{in: `2abc["message"]`, wantErr: true},   // invalid ack id
		{in: `3{}`, wantErr: true},               // ACK must be an array
		{in: `4[]`, wantErr: true},               // CONNECT_ERROR object or string
		{in: `5["x"]`, wantErr: true},            // missing attachment count
		{in: `5-["x"]`, wantErr: true},           // empty attachment count
		{in: `51["x"]`, wantErr: true},           // count without '-'
		{in: `2["x",]`, wantErr: true},           // invalid JSON
		{in: `2123456789012345678901["x"]`, wantErr: true},
		{in: `299999999999999999999["x"]`, wantErr: true},
		{in: `5999999999-["x"]`, wantErr: true},
	}
	for _, tc := range cases {
		got, err := DecodeSIO([]byte(tc.in))
		if tc.wantErr {
			if !errors.Is(err, ErrInvalidPacket) {
				t.Errorf("DecodeSIO(%q) = %+v, %v; want ErrInvalidPacket", tc.in, got, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("DecodeSIO(%q): %v", tc.in, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("DecodeSIO(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
		want := tc.in
		if tc.canonical != "" {
			want = tc.canonical
		}
		if enc := AppendSIO(nil, got); string(enc) != want {
			t.Errorf("AppendSIO(DecodeSIO(%q)) = %q, want %q", tc.in, enc, want)
		}
	}
}

func TestSplitEvent(t *testing.T) {
	t.Parallel()
	name, args, err := SplitEvent(json.RawMessage(`["echo",{"a":1}, 2 ,"x"]`))
	if err != nil {
		t.Fatal(err)
	}
	if name != "echo" || len(args) != 3 || string(args[0]) != `{"a":1}` || string(args[1]) != `2` || string(args[2]) != `"x"` {
		t.Fatalf("SplitEvent = %q %q", name, args)
	}
}

func TestDeconstruct(t *testing.T) {
	t.Parallel()
	in := []any{"a", []byte{1}, map[string]any{"k": []byte{2}, "j": 1}, []any{[]byte{3}}, [][]byte{{4}}}
	var atts [][]byte
	out := Deconstruct(in, &atts)
	if len(atts) != 4 {
		t.Fatalf("got %d attachments, want 4", len(atts))
	}
	data, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckPlaceholders(data, len(atts)); err != nil {
		t.Fatal(err)
	}
	back, err := Reconstruct(data, atts)
	if err != nil {
		t.Fatal(err)
	}
	want := []any{"a", []byte{1}, map[string]any{"k": []byte{2}, "j": json.Number("1")}, []any{[]byte{3}}, []any{[]byte{4}}}
	if !reflect.DeepEqual(back, want) {
		t.Fatalf("Reconstruct = %#v, want %#v", back, want)
	}
	// The input is untouched.
	if _, ok := in[1].([]byte); !ok {
		t.Fatal("Deconstruct modified its input")
	}
	// No binary: the very same value comes back.
	plain := map[string]any{"a": 1}
	if got := Deconstruct(plain, &atts); !reflect.DeepEqual(got, plain) || len(atts) != 4 {
		t.Fatal("Deconstruct changed a value without binary data")
	}
}

func TestInlineAttachments(t *testing.T) {
	t.Parallel()
	data := json.RawMessage(`[{"file":{"_placeholder":true,"num":0},"n":1},{"_placeholder":true,"num":1}]`)
	got, err := InlineAttachments(data, [][]byte{{1, 2, 3, 4}, {}})
	if err != nil {
		t.Fatal(err)
	}
	var v []any
	if err := json.Unmarshal(got, &v); err != nil {
		t.Fatal(err)
	}
	want := []any{map[string]any{"file": "AQIDBA==", "n": float64(1)}, ""}
	if !reflect.DeepEqual(v, want) {
		t.Fatalf("InlineAttachments = %s", got)
	}
	for _, bad := range []string{
		`[{"_placeholder":true,"num":2}]`,
		`[{"_placeholder":true,"num":-1}]`,
		`[{"_placeholder":true,"num":"0"}]`,
		`[{"_placeholder":true}]`,
		`[`,
	} {
		if _, err := InlineAttachments(json.RawMessage(bad), [][]byte{{1}, {2}}); !errors.Is(err, ErrInvalidPacket) {
			t.Errorf("InlineAttachments(%s) err = %v, want ErrInvalidPacket", bad, err)
		}
	}
	// Without placeholders the input comes back unchanged.
	plain := json.RawMessage(`[1, {"a": [true]}]`)
	if got, err := InlineAttachments(plain, nil); err != nil || string(got) != string(plain) {
		t.Fatalf("InlineAttachments(plain) = %s, %v", got, err)
	}
}
