package server_test

import (
	"testing"

	"github.com/zndraw/joblib/joblib"
)

// Finding 3: a provider's bytes are served from the API's origin, so a
// provider registered as text/html must not become a page of that origin.
// Every read answer says nosniff; active types are also sandboxed and
// downloaded, however the answer came (cached, or waited for while the
// worker uploads); the type is echoed at registration and in /info.
func TestProviderReadActiveContentIsInert(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		page := []byte(`<script>fetch("/v1/joblib/rooms/x/jobs",{method:"PUT",credentials:"include"})</script>`)
		for _, ct := range []string{"text/html", "Text/HTML; charset=utf-8", "image/svg+xml", "application/javascript"} {
			name := "page-" + joblib.RequestHash(map[string]string{"ct": ct})[:8]
			reg := e.registerProvider(e.bob, "bob", "files", name, map[string]any{"content_type": ct}).want(201).M()
			if reg["content_type"] != ct {
				t.Fatalf("registration echoes content_type %v, want %q", reg["content_type"], ct)
			}
			full := "bob:files:" + name
			info := e.do(e.bob, "GET", api+"/rooms/bob/providers/"+full+"/info", nil).want(200)
			if info.M()["content_type"] != ct || info.Header.Get("X-Content-Type-Options") != "nosniff" {
				t.Fatalf("info: %s %v", info.Body, info.Header)
			}
			id := reg["id"].(string)

			// cached
			e.upload(e.bob, id, joblib.RequestHash(map[string]string{"p": "1"}), page).want(204)
			cached := e.readProvider(e.alice, "bob", full, map[string]string{"p": "1"}).want(200)
			// waited for: the worker answers the dispatched request
			serveProvider(t, e.bus, e.url, e.bob, id, full, func(map[string]string) []byte { return page })
			waited := e.readProvider(e.alice, "bob", full, map[string]string{"p": "2"}, "Prefer: wait=5").want(200)
			for which, r := range map[string]resp{"cached": cached, "waited": waited} {
				h := r.Header
				if h.Get("Content-Type") != ct || h.Get("X-Content-Type-Options") != "nosniff" ||
					h.Get("Content-Security-Policy") != "sandbox" || h.Get("Content-Disposition") != "attachment" || string(r.Body) != string(page) {
					t.Fatalf("%s read of a %q provider: %v %q", which, ct, h, r.Body)
				}
			}
		}

		// Passive types are served as they were, nosniff added.
		id := e.provider(e.bob, "bob", "frames", "json")
		e.upload(e.bob, id, joblib.RequestHash(map[string]string{}), []byte(`{"a":1}`)).want(204)
		r := e.readProvider(e.alice, "bob", "bob:frames:json", nil).want(200)
		if h := r.Header; h.Get("Content-Type") != "application/json" || h.Get("X-Content-Type-Options") != "nosniff" ||
			h.Get("Content-Security-Policy") != "" || h.Get("Content-Disposition") != "" {
			t.Fatalf("json read: %v", h)
		}
		// So are refusals (a timeout here).
		to := e.readProvider(e.alice, "bob", "bob:frames:json", map[string]string{"n": "1"}, "Prefer: wait=0")
		if to.Status != 504 || to.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Fatalf("timeout: %d %v", to.Status, to.Header)
		}
	})
}
