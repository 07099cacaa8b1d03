// Package clientaddr finds the address of the client behind an HTTP
// request: the TCP peer's, or, when the peer is a trusted reverse proxy, the
// address the proxies recorded in X-Forwarded-For or Forwarded (RFC 7239).
//
// Headers are believed only from trusted peers. A chain is walked from the
// right (the entry the nearest proxy appended) and trusted hops are
// skipped: the first untrusted address is the client. Everything to its
// left was written by the client and is ignored. When the request carries
// X-Forwarded-For, that header is used (every common proxy writes it);
// Forwarded only when it does not.
package clientaddr

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// Proxies is a set of trusted proxy networks. The zero value trusts none:
// every request's client is its TCP peer.
type Proxies struct {
	nets []netip.Prefix
}

// ParseProxies parses CIDRs ("10.0.0.0/8", "fd00::/8") or single addresses;
// entries may carry spaces and empty ones are skipped. The error names the
// entry, not the variable (the caller knows which that is).
func ParseProxies(list []string) (Proxies, error) {
	var p Proxies
	for _, s := range list {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if pre, err := netip.ParsePrefix(s); err == nil {
			p.nets = append(p.nets, pre.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return Proxies{}, fmt.Errorf("%q is not a CIDR (such as 10.0.0.0/8 or fd00::/8) or an IP address", s)
		}
		a = a.Unmap()
		p.nets = append(p.nets, netip.PrefixFrom(a, a.BitLen()))
	}
	return p, nil
}

// Empty reports whether no proxy is trusted.
func (p Proxies) Empty() bool { return len(p.nets) == 0 }

// trusts reports whether a is inside a trusted network.
func (p Proxies) trusts(a netip.Addr) bool {
	a = a.Unmap()
	for _, n := range p.nets {
		if n.Contains(a) {
			return true
		}
	}
	return false
}

// Resolve returns the client address of r, without a port: the TCP peer's,
// or, if the peer is trusted, the rightmost untrusted address of the
// forwarding header (the leftmost one when every hop is trusted; the
// nearest trusted hop when the chain holds something that is no address,
// such as "unknown"). A RemoteAddr that is no IP address (a Unix socket) is
// returned as it is.
func (p Proxies) Resolve(r *http.Request) string {
	peer, ok := parseNode(r.RemoteAddr)
	if !ok {
		return r.RemoteAddr
	}
	if !p.trusts(peer) {
		return peer.String()
	}
	var hops []string
	if xff := r.Header.Values("X-Forwarded-For"); len(xff) > 0 {
		for _, line := range xff {
			hops = append(hops, strings.Split(line, ",")...)
		}
	} else {
		hops = forwardedFor(r.Header.Values("Forwarded"))
	}
	client := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a, ok := parseNode(hops[i])
		if !ok {
			break // the nearest trusted hop stands for what it forwarded
		}
		client = a
		if !p.trusts(a) {
			break
		}
	}
	return client.String()
}

// parseNode parses one hop: an IPv4 or IPv6 address, optionally with a
// port ("192.0.2.1:80", "[2001:db8::1]:80") or in brackets, surrounding
// spaces allowed. A 4-in-6 address is returned as IPv4 and a zone dropped,
// so that one client has one spelling.
func parseNode(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if host, _, err := net.SplitHostPort(s); err == nil {
		s = host
	} else if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		s = s[1 : len(s)-1]
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}

// forwardedFor returns the for= value of each element of Forwarded header
// lines, in order (RFC 7239 §4: elements separated by commas, pairs by
// semicolons, values tokens or quoted strings). An element without for=
// yields "" (no address), so that it stops the walk like "unknown" does.
func forwardedFor(lines []string) []string {
	var out []string
	for _, line := range lines {
		var (
			key, val strings.Builder
			inVal    bool // after '=' of the current pair
			quoted   bool // inside a quoted string
			escaped  bool
			forVal   string
			hasFor   bool
		)
		endPair := func() {
			if strings.EqualFold(strings.TrimSpace(key.String()), "for") && !hasFor {
				forVal, hasFor = val.String(), true
			}
			key.Reset()
			val.Reset()
			inVal = false
		}
		endElement := func() {
			endPair()
			out = append(out, forVal)
			forVal, hasFor = "", false
		}
		for i := 0; i < len(line); i++ {
			c := line[i]
			switch {
			case quoted && escaped:
				val.WriteByte(c)
				escaped = false
			case quoted && c == '\\':
				escaped = true
			case quoted && c == '"':
				quoted = false
			case quoted:
				val.WriteByte(c)
			case c == '"' && inVal:
				quoted = true
			case c == ';':
				endPair()
			case c == ',':
				endElement()
			case c == '=' && !inVal:
				inVal = true
			case c == ' ' || c == '\t':
			case inVal:
				val.WriteByte(c)
			default:
				key.WriteByte(c)
			}
		}
		endElement()
	}
	return out
}

type ctxKey struct{}

// Handler stores each request's resolved client address where Of finds it,
// then calls next.
func (p Proxies) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(NewContext(r.Context(), p.Resolve(r))))
	})
}

// NewContext returns ctx carrying addr as the client address.
func NewContext(ctx context.Context, addr string) context.Context {
	return context.WithValue(ctx, ctxKey{}, addr)
}

// FromContext returns the client address a Handler (or NewContext) put into
// ctx, or "" when there is none (work not started by a request).
func FromContext(ctx context.Context) string {
	a, _ := ctx.Value(ctxKey{}).(string)
	return a
}

// Of returns the client address of r: the one Handler resolved, else the
// TCP peer's IP address (no proxy trusted). This is the address every
// per-address budget, log line and audit row uses.
func Of(r *http.Request) string {
	if a := FromContext(r.Context()); a != "" {
		return a
	}
	return Proxies{}.Resolve(r)
}
