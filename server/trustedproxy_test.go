package server_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/server"
)

// Behind a reverse proxy on loopback (httputil.ReverseProxy appends the
// address it saw to X-Forwarded-For), the per-address socket session budget
// is per client when the proxy is trusted, and shared when it is not; a
// client that sends X-Forwarded-For itself, from an untrusted address,
// does not get a budget of its own. Audit rows name the client.
func TestTrustedProxyAddressBudgets(t *testing.T) {
	t.Parallel()
	rtc := server.DefaultRealtimeConfig() // long ping: an idle polling session stays open
	rtc.MaxSessionsPerAddr = 1
	for _, c := range []struct {
		name    string
		trusted []string
	}{
		{"trusted", []string{"127.0.0.0/8", "::1"}},
		{"none trusted", nil},
		{"others trusted", []string{"192.0.2.0/24"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cfg := server.DefaultConfig()
			cfg.TrustedProxies = c.trusted
			eachWith(t, []func(*setupOpts){withServer(cfg), withRealtime(rtc)}, func(t *testing.T, e *env) {
				target, err := url.Parse(e.url)
				if err != nil {
					t.Fatal(err)
				}
				proxy := httptest.NewServer(httputil.NewSingleHostReverseProxy(target))
				defer proxy.Close()
				open := func(base, client string) int {
					t.Helper()
					req, err := http.NewRequest("GET", base+"/socket.io/?EIO=4&transport=polling", nil)
					if err != nil {
						t.Fatal(err)
					}
					req.Header.Set("X-Forwarded-For", client)
					res, err := http.DefaultClient.Do(req)
					if err != nil {
						t.Fatal(err)
					}
					res.Body.Close()
					return res.StatusCode
				}
				trusted := c.trusted != nil && strings.HasPrefix(c.trusted[0], "127.")
				if s := open(proxy.URL, "203.0.113.1"); s != 200 {
					t.Fatalf("first client through the proxy: %d", s)
				}
				second := open(proxy.URL, "203.0.113.2")
				if trusted && second != 200 {
					t.Fatalf("second client through a trusted proxy: %d, want its own budget (200)", second)
				}
				if !trusted && second != 429 {
					t.Fatalf("second client through an untrusted proxy: %d, want the proxy's shared budget (429)", second)
				}
				if trusted {
					if s := open(proxy.URL, "203.0.113.1"); s != 429 {
						t.Fatalf("first client again: %d, want 429", s)
					}
					// The audit row of an action made through the proxy
					// names the client, not the proxy.
					w := e.newWorker(e.alice)
					req, _ := http.NewRequest("DELETE", proxy.URL+api+"/workers/"+w, nil)
					req.Header.Set("Authorization", "Bearer "+e.admin)
					req.Header.Set("X-Forwarded-For", "198.51.100.7")
					res, err := http.DefaultClient.Do(req)
					if err != nil {
						t.Fatal(err)
					}
					res.Body.Close()
					al, err := e.svc.ListAudit(context.Background(), joblib.AuditWorkerDelete, 1)
					if res.StatusCode != 204 || err != nil || len(al) != 1 || !strings.Contains(string(al[0].Detail), `"client_addr":"198.51.100.7"`) {
						t.Fatalf("delete %d, audit %v %+v", res.StatusCode, err, al)
					}
					return
				}
				// Not trusted: a client's own X-Forwarded-For, sent
				// straight to joblib, buys no budget either.
				if s := open(e.url, "203.0.113.3"); s != 429 {
					t.Fatalf("spoofed X-Forwarded-For from an untrusted peer: %d, want 429", s)
				}
			})
		})
	}
}
