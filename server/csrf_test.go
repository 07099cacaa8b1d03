package server_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/zndraw/joblib/server"
)

// A write authenticated only by the joblib_token cookie must come from the
// server's own origin or an allowed one and carry a JSON content type;
// otherwise it is a 403 problem and changes nothing. Bearer requests and
// reads are unaffected.
func TestCookieWritesRefuseCrossSite(t *testing.T) {
	t.Parallel()
	cfg := server.DefaultConfig()
	cfg.AllowedOrigins = []string{"app.example.com", "*.example.org"}
	eachWith(t, []func(*setupOpts){withServer(cfg)}, func(t *testing.T, e *env) {
		send := func(cookie, bearer bool, method, path, body string, hdr map[string]string) (int, string, string) {
			t.Helper()
			var rd io.Reader
			if body != "" {
				rd = strings.NewReader(body)
			}
			req, _ := http.NewRequest(method, e.url+path, rd)
			if cookie {
				req.AddCookie(&http.Cookie{Name: "joblib_token", Value: e.alice})
			}
			if bearer {
				req.Header.Set("Authorization", "Bearer "+e.alice)
			}
			for k, v := range hdr {
				req.Header.Set(k, v)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			return res.StatusCode, res.Header.Get("Content-Type"), string(b)
		}
		self := e.url
		refused := []struct {
			name string
			hdr  map[string]string
		}{
			{"other origin", map[string]string{"Origin": "http://evil.example", "Content-Type": "application/json"}},
			{"look-alike origin", map[string]string{"Origin": "http://app.example.com.evil.example", "Content-Type": "application/json"}},
			{"null origin", map[string]string{"Origin": "null", "Content-Type": "application/json"}},
			{"cross-site fetch", map[string]string{"Sec-Fetch-Site": "cross-site", "Content-Type": "application/json"}},
			{"same-site fetch", map[string]string{"Sec-Fetch-Site": "same-site", "Content-Type": "application/json"}},
			{"same origin, text/plain", map[string]string{"Origin": self, "Content-Type": "text/plain"}},
			{"same origin, form", map[string]string{"Origin": self, "Content-Type": "application/x-www-form-urlencoded"}},
			{"same origin, no content type", map[string]string{"Origin": self}},
			{"no headers, text/plain", map[string]string{"Content-Type": "text/plain;charset=UTF-8"}},
		}
		for _, c := range refused {
			st, ct, body := send(true, false, "POST", api+"/workers", "", c.hdr)
			if st != 403 || ct != "application/problem+json" || !strings.Contains(body, "/v1/problems/forbidden") || !strings.Contains(body, "cookie-authenticated") {
				t.Fatalf("%s: %d %s %s", c.name, st, ct, body)
			}
			st, _, body = send(true, false, "POST", api+"/rooms/room/tasks/"+rotate, `{"payload":{}}`, c.hdr)
			if st != 403 {
				t.Fatalf("%s submit: %d %s", c.name, st, body)
			}
		}
		if n := e.total(api + "/workers"); n != 0 {
			t.Fatalf("refused writes created %d workers", n)
		}
		accepted := []map[string]string{
			{"Origin": self, "Content-Type": "application/json"},
			{"Origin": "https://app.example.com", "Content-Type": "application/json; charset=utf-8"},
			{"Origin": "https://ui.example.org", "Content-Type": "application/merge-patch+json"},
			{"Sec-Fetch-Site": "same-origin", "Content-Type": "application/json"},
			{"Content-Type": "application/json"}, // not a browser: no Origin, no Sec-Fetch-Site
		}
		for _, h := range accepted {
			if st, _, body := send(true, false, "POST", api+"/workers", "", h); st != 201 {
				t.Fatalf("%v: %d %s", h, st, body)
			}
		}
		// Bearer requests are not judged by origin or content type, even
		// with the cookie present; reads with the cookie are not either.
		if st, _, body := send(true, true, "POST", api+"/workers", "", map[string]string{"Origin": "http://evil.example", "Content-Type": "text/plain"}); st != 201 {
			t.Fatalf("bearer: %d %s", st, body)
		}
		if st, _, body := send(true, false, "GET", api+"/workers", "", map[string]string{"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}); st != 200 {
			t.Fatalf("cookie read: %d %s", st, body)
		}
	})
}
