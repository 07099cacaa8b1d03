package clientaddr

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
)

func mustProxies(t testing.TB, list ...string) Proxies {
	t.Helper()
	p, err := ParseProxies(list)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func request(peer string, hdr ...string) *http.Request {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = peer
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	return r
}

func TestResolve(t *testing.T) {
	t.Parallel()
	p := mustProxies(t, "10.0.0.0/8", " 192.168.1.1", "fd00::/8")
	cases := []struct {
		name string
		r    *http.Request
		want string
	}{
		{"untrusted peer: header ignored", request("203.0.113.9:5000", "X-Forwarded-For", "198.51.100.1"), "203.0.113.9"},
		{"untrusted peer: Forwarded ignored", request("203.0.113.9:5000", "Forwarded", "for=198.51.100.1"), "203.0.113.9"},
		{"trusted peer, no header", request("10.1.2.3:5000"), "10.1.2.3"},
		{"one hop", request("10.1.2.3:5000", "X-Forwarded-For", "198.51.100.1"), "198.51.100.1"},
		{"client spoofs left of the real address", request("10.1.2.3:5000", "X-Forwarded-For", "1.1.1.1, 198.51.100.1"), "198.51.100.1"},
		{"trusted hops skipped", request("10.1.2.3:5000", "X-Forwarded-For", "1.1.1.1, 198.51.100.1, 192.168.1.1,10.9.9.9"), "198.51.100.1"},
		{"several header lines in order", request("10.1.2.3:5000", "X-Forwarded-For", "1.1.1.1", "X-Forwarded-For", "198.51.100.2, 10.0.0.7"), "198.51.100.2"},
		{"all hops trusted: the leftmost", request("10.1.2.3:5000", "X-Forwarded-For", "10.0.0.5, 10.0.0.6"), "10.0.0.5"},
		{"garbage stops the walk at the nearest trusted hop", request("10.1.2.3:5000", "X-Forwarded-For", "198.51.100.1, unknown, 10.0.0.6"), "10.0.0.6"},
		{"garbage rightmost: the peer", request("10.1.2.3:5000", "X-Forwarded-For", "198.51.100.1, not-an-ip"), "10.1.2.3"},
		{"empty entry is garbage", request("10.1.2.3:5000", "X-Forwarded-For", "198.51.100.1,,"), "10.1.2.3"},
		{"XFF entry with port", request("10.1.2.3:5000", "X-Forwarded-For", "198.51.100.1:4711"), "198.51.100.1"},
		{"XFF IPv6", request("10.1.2.3:5000", "X-Forwarded-For", "2001:db8::1"), "2001:db8::1"},
		{"XFF bracketed IPv6 with port", request("10.1.2.3:5000", "X-Forwarded-For", "[2001:db8::1]:80"), "2001:db8::1"},
		{"4-in-6 peer is IPv4", request("[::ffff:10.1.2.3]:5000", "X-Forwarded-For", "198.51.100.1"), "198.51.100.1"},
		{"IPv6 peer trusted", request("[fd00::1]:5000", "X-Forwarded-For", "198.51.100.1"), "198.51.100.1"},
		{"XFF wins over Forwarded", request("10.1.2.3:5000", "X-Forwarded-For", "198.51.100.1", "Forwarded", "for=1.1.1.1"), "198.51.100.1"},
		{"Forwarded", request("10.1.2.3:5000", "Forwarded", "for=198.51.100.1;proto=https;by=10.1.2.3"), "198.51.100.1"},
		{"Forwarded quoted IPv6 with port", request("10.1.2.3:5000", "Forwarded", `for="[2001:db8:cafe::17]:4711"`), "2001:db8:cafe::17"},
		{"Forwarded chain and case", request("10.1.2.3:5000", "Forwarded", `for=1.1.1.1, For="198.51.100.3";proto=http, for=10.0.0.9`), "198.51.100.3"},
		{"Forwarded over two lines", request("10.1.2.3:5000", "Forwarded", "for=1.1.1.1", "Forwarded", "for=198.51.100.4"), "198.51.100.4"},
		{"Forwarded quoted comma does not split", request("10.1.2.3:5000", "Forwarded", `for=198.51.100.5;x="a,b", for=10.0.0.1`), "198.51.100.5"},
		{"Forwarded unknown", request("10.1.2.3:5000", "Forwarded", "for=198.51.100.1, for=unknown"), "10.1.2.3"},
		{"Forwarded obfuscated", request("10.1.2.3:5000", "Forwarded", "for=_hidden"), "10.1.2.3"},
		{"Forwarded element without for", request("10.1.2.3:5000", "Forwarded", "for=198.51.100.1, proto=https"), "10.1.2.3"},
		{"unix socket peer", request("@", "X-Forwarded-For", "198.51.100.1"), "@"},
	}
	for _, c := range cases {
		if got := p.Resolve(c.r); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
	// Nothing trusted: the peer, whatever the headers say.
	if got := (Proxies{}).Resolve(request("10.1.2.3:5000", "X-Forwarded-For", "198.51.100.1")); got != "10.1.2.3" {
		t.Errorf("no proxies: got %q", got)
	}
}

func TestParseProxies(t *testing.T) {
	t.Parallel()
	p, err := ParseProxies([]string{"10.0.0.0/8", "", " 2001:db8::/32 ", "192.0.2.7", "::1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"10.200.0.1", "2001:db8::5", "192.0.2.7", "::1", "::ffff:10.0.0.1"} {
		if !p.trusts(netip.MustParseAddr(a)) {
			t.Errorf("%s not trusted", a)
		}
	}
	if p.trusts(netip.MustParseAddr("192.0.2.8")) {
		t.Error("192.0.2.8 trusted")
	}
	for _, bad := range []string{"10.0.0.0/33", "example.com", "10.0.0", "fe80::1%eth0"} {
		if _, err := ParseProxies([]string{bad}); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("%q: err %v, want one naming it", bad, err)
		}
	}
	if p, err := ParseProxies(nil); err != nil || !p.Empty() {
		t.Errorf("nil: %v %v", p, err)
	}
}

func TestOf(t *testing.T) {
	t.Parallel()
	p := mustProxies(t, "127.0.0.0/8")
	var got string
	h := p.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = Of(r) }))
	h.ServeHTTP(httptest.NewRecorder(), request("127.0.0.1:1", "X-Forwarded-For", "198.51.100.1"))
	if got != "198.51.100.1" {
		t.Errorf("through Handler: %q", got)
	}
	// Without the Handler: the peer, never the header.
	if got := Of(request("127.0.0.1:1", "X-Forwarded-For", "198.51.100.1")); got != "127.0.0.1" {
		t.Errorf("without Handler: %q", got)
	}
}

// FuzzResolve: whatever the headers, an untrusted peer is the answer, and
// a trusted peer's answer is an IP address (never a header fragment).
func FuzzResolve(f *testing.F) {
	f.Add("10.0.0.1:80", "198.51.100.1, 10.0.0.2", `for="[2001:db8::1]:80";proto=https, for=unknown`)
	f.Add("203.0.113.1:80", "1.1.1.1", "for=1.1.1.1")
	f.Add("[fd00::1]:80", "", `for="\"[::1]\"", for=`)
	p := mustProxies(f, "10.0.0.0/8", "fd00::/8")
	f.Fuzz(func(t *testing.T, peer, xff, fwd string) {
		r := request(peer)
		if xff != "" {
			r.Header.Set("X-Forwarded-For", xff)
		}
		r.Header.Set("Forwarded", fwd)
		got := p.Resolve(r)
		pa, ok := parseNode(peer)
		switch {
		case !ok:
			if got != peer {
				t.Fatalf("peer %q is no address: got %q", peer, got)
			}
		case !p.trusts(pa):
			if got != pa.String() {
				t.Fatalf("untrusted peer %q: got %q", peer, got)
			}
		default:
			if a, err := netip.ParseAddr(got); err != nil || a.Zone() != "" || a.Is4In6() {
				t.Fatalf("trusted peer %q, xff %q, fwd %q: got %q, not a plain address", peer, xff, fwd, got)
			}
		}
	})
}
