package canonical

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"os/exec"
	"strings"
	"testing"
	"unicode/utf8"
)

// The test vectors of contract §7.4, verbatim.
func TestRequestHashContractVectors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		params    map[string]string
		canonical string
		hash      string
	}{
		{map[string]string{}, `{}`, "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"},
		{map[string]string{"path": "/data"}, `{"path":"/data"}`, "cc2a66974085ce9f0bad658dea3cec4422bde979305a7bd08dd771bba5214ff2"},
		{map[string]string{"b": "2", "a": "1"}, `{"a":"1","b":"2"}`, "21f76dfbfe6dfe21f762080ef484112cf2952974cef30741fd1931e1c6d92112"},
		{map[string]string{"index": "0"}, `{"index":"0"}`, "7fd1a85e0915de5933dc31c0be57983c7c7c6dced819240b0b3f3eaa18653282"},
		{
			map[string]string{"path": "/dätä<&>", "q": "x\ny\x7f\U0001F600"},
			`{"path":"/d\u00e4t\u00e4<&>","q":"x\ny\u007f\ud83d\ude00"}`,
			"ad7f37ada133c41bd20b036b7d734deae294e729c47d00dee906fdd9c083e69f",
		},
	}
	for _, c := range cases {
		if got := CanonicalParams(c.params); got != c.canonical {
			t.Errorf("CanonicalParams(%q) = %s, want %s", c.params, got, c.canonical)
		}
		if got := RequestHash(c.params); got != c.hash {
			t.Errorf("RequestHash(%q) = %s, want %s", c.params, got, c.hash)
		}
	}
}

// test_request_hash_deterministic / _order_independent / _different_params.
func TestRequestHashProperties(t *testing.T) {
	t.Parallel()
	a := RequestHash(map[string]string{"path": "/data", "index": "1"})
	if a != RequestHash(map[string]string{"path": "/data", "index": "1"}) {
		t.Fatal("same params hash differently")
	}
	if a != RequestHash(map[string]string{"index": "1", "path": "/data"}) {
		t.Fatal("key order changed the hash")
	}
	if a == RequestHash(map[string]string{"path": "/data", "index": "2"}) {
		t.Fatal("different params hash the same")
	}
	if len(a) != 64 || strings.ToLower(a) != a {
		t.Fatalf("hash %q is not lowercase hex SHA-256", a)
	}
}

// Outputs of Python 3's json.dumps(v, sort_keys=True, separators=(",", ":")).
func TestCanonicalJSONMatchesPython(t *testing.T) {
	t.Parallel()
	cases := []struct {
		v    any
		want string
	}{
		{map[string]any{"a": []any{1, true, nil, "\u2028\x00\x1f\"\\/"}, "\u00e9": 1, "Z": 2, "\U0001F600": 3, "\uffff": 4},
			`{"Z":2,"a":[1,true,null,"\u2028\u0000\u001f\"\\/"],"\u00e9":1,"\uffff":4,"\ud83d\ude00":3}`},
		{1.0, "1.0"}, {1e16, "1e+16"}, {1e-5, "1e-05"}, {1.5e-7, "1.5e-07"}, {123456.789, "123456.789"},
		{1e22, "1e+22"}, {0.1, "0.1"}, {math.Copysign(0, -1), "-0.0"}, {1e15, "1000000000000000.0"},
		{12345678901234567.0, "1.2345678901234568e+16"}, {5e-324, "5e-324"},
		{1.7976931348623157e308, "1.7976931348623157e+308"}, {0.0001, "0.0001"}, {100.0, "100.0"},
		{-2.5, "-2.5"}, {math.NaN(), "NaN"}, {math.Inf(-1), "-Infinity"}, {json.Number("42"), "42"},
		{"\b\f\n\r\t", `"\b\f\n\r\t"`}, {false, "false"},
	}
	for _, c := range cases {
		got, err := CanonicalJSON(c.v)
		if err != nil {
			t.Fatalf("CanonicalJSON(%#v): %v", c.v, err)
		}
		if got != c.want {
			t.Errorf("CanonicalJSON(%#v) = %s, want %s", c.v, got, c.want)
		}
	}
	for _, bad := range []any{struct{}{}, "\xff", map[string]any{"\xfe": 1}, []int{1}} {
		if _, err := CanonicalJSON(bad); err == nil {
			t.Errorf("CanonicalJSON(%#v) accepted an unsupported value", bad)
		}
	}
}

// randomParams builds read parameters rich in the characters the escaping
// rules treat specially.
func randomParams(r *rand.Rand) map[string]string {
	alphabet := []rune{'a', 'Z', '0', ' ', '/', '<', '>', '&', '"', '\\', '\n', '\r', '\t', '\b', '\f', 0, 0x1f, 0x7f, 0x80,
		0xe4, 0x2028, 0xd7ff, 0xe000, 0xfffd, 0xffff, 0x10000, 0x1f600, 0x10ffff, '=', '+', '%'}
	str := func() string {
		n := r.IntN(8)
		var b strings.Builder
		for range n {
			b.WriteRune(alphabet[r.IntN(len(alphabet))])
		}
		return b.String()
	}
	m := map[string]string{}
	for range r.IntN(5) {
		m[str()] = str()
	}
	return m
}

// The Python server's hash, computed by Python itself, agrees with ours on
// many random inputs (python3 is provisioned by scripts/test.sh).
func TestRequestHashAgreesWithPython(t *testing.T) {
	t.Parallel()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is required for the cross-language hash check (scripts/test.sh installs it): %v", err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	inputs := make([]map[string]string, 400)
	for i := range inputs {
		inputs[i] = randomParams(r)
	}
	in, err := json.Marshal(inputs)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "-c", `import sys, json, hashlib
for p in json.load(sys.stdin):
    print(hashlib.sha256(json.dumps(p, sort_keys=True, separators=(",", ":")).encode()).hexdigest())`)
	cmd.Stdin = strings.NewReader(string(in))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3: %v", err)
	}
	lines := strings.Fields(string(out))
	if len(lines) != len(inputs) {
		t.Fatalf("python printed %d hashes for %d inputs", len(lines), len(inputs))
	}
	for i, p := range inputs {
		if got := RequestHash(p); got != lines[i] {
			t.Fatalf("params %q: hash %s, Python %s (canonical %s)", p, got, lines[i], CanonicalParams(p))
		}
	}
}

func FuzzCanonicalParams(f *testing.F) {
	f.Add("path", "/data", "index", "0")
	f.Add("path", "/dätä<&>", "q", "x\ny\x7f\U0001F600")
	f.Add("", "", "\u2028", "\"\\")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		for _, s := range []string{k1, v1, k2, v2} {
			if !utf8.ValidString(s) {
				return // the read endpoint rejects non-UTF-8 params before hashing
			}
		}
		params := map[string]string{k1: v1, k2: v2}
		got := CanonicalParams(params)
		for i := 0; i < len(got); i++ {
			if got[i] < 0x20 || got[i] > 0x7e {
				t.Fatalf("canonical form %q has byte %#x outside printable ASCII", got, got[i])
			}
		}
		for _, unescaped := range []string{`\/`, `\u003c`, `\u003e`, `\u0026`, `\u00E`, `\uD`} {
			if strings.Contains(got, unescaped) {
				t.Fatalf("canonical form %q contains %s", got, unescaped)
			}
		}
		var back map[string]string
		if err := json.Unmarshal([]byte(got), &back); err != nil {
			t.Fatalf("canonical form %q is not JSON: %v", got, err)
		}
		if len(back) != len(params) {
			t.Fatalf("round trip of %q lost keys: %q", params, back)
		}
		for k, v := range params {
			if back[k] != v {
				t.Fatalf("round trip of %q changed %q: %q", params, k, back[k])
			}
		}
		if RequestHash(params) != Hash(got) {
			t.Fatal("hash is not the SHA-256 of the canonical form")
		}
	})
}
