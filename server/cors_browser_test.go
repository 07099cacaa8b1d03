package server_test

import (
	"context"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/zndraw/joblib/internal/browser"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
	"github.com/zndraw/joblib/web"
)

// crossOriginPage is a UI served from another origin than the API: it joins
// room "r" over Socket.IO (the dashboard's small client) and, on each
// jobs_invalidate, refetches the room's jobs with its token in the
// Authorization header, as a ZnDraw-like frontend does.
const crossOriginPage = `<!doctype html><meta charset="utf-8"><script type="module">
import { SocketIO } from "./sio.js";
const api = "API", token = "TOKEN";
const auth = { headers: { Authorization: "Bearer " + token } };
window.__refetch = [];
const sock = new SocketIO(api.replace("http", "ws") + "/socket.io/?EIO=4&transport=websocket", { token }, {
  onRefused: (m) => { window.__refused = m; },
  onDisconnect: (m) => { window.__disc = m; },
  onConnect: async () => { const [a] = await sock.emit("join_room", { room_id: "r" }, true); window.__joined = a; },
  onEvent: async (name) => {
    if (name !== "jobs_invalidate") return;
    try {
      const res = await fetch(api + "/v1/joblib/rooms/r/jobs", auth);
      window.__refetch.push({ status: res.status, body: await res.json() });
    } catch (e) {
      window.__refetch.push({ error: String(e) });
    }
  },
});
sock.open();
// probe answers what a UI also needs from a cross-origin API: a 202's
// Location, a problem's body, and a cookie-mode request refused.
window.probe = async () => {
  const out = {};
  const sub = await fetch(api + "/v1/joblib/rooms/r/tasks/r:modifiers:Rotate", {
    method: "POST", body: "{}", headers: { ...auth.headers, "Content-Type": "application/json", "Prefer": "respond-async" } });
  out.submit = { status: sub.status, location: sub.headers.get("Location") };
  const miss = await fetch(api + "/v1/joblib/rooms/r/jobs/r:modifiers:Nope", auth);
  out.missing = { status: miss.status, type: (await miss.json()).type };
  try {
    await fetch(api + "/v1/joblib/rooms/r/jobs", { credentials: "include" });
    out.cookieMode = "readable";
  } catch (e) {
    out.cookieMode = "refused";
  }
  return out;
};
</script>`

// TestCrossOriginUIInBrowser: a page on another origin (another port) gets
// its events over Socket.IO and, after a jobs_invalidate, lists the room's
// jobs with fetch and an Authorization header: the CORS preflight passes.
func TestCrossOriginUIInBrowser(t *testing.T) {
	t.Parallel()
	bin, err := browser.Find()
	if err != nil {
		t.Fatalf("%v (scripts/test.sh installs Debian's chromium)", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := browser.Launch(ctx, bin)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	sio, err := fs.ReadFile(web.UI, "sio.js")
	if err != nil {
		t.Fatal(err)
	}
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		var page string
		ui := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/sio.js" {
				w.Header().Set("Content-Type", "text/javascript")
				_, _ = w.Write(sio)
				return
			}
			w.Header().Set("Content-Type", "text/html")
			_, _ = w.Write([]byte(page))
		}))
		defer ui.Close()
		cfg := server.DefaultConfig()
		cfg.AllowedOrigins = []string{strings.TrimPrefix(ui.URL, "http://")}
		e := setup(t, db, withServer(cfg), withRealtime(realtimeCfg()))
		page = strings.NewReplacer("API", e.url, "TOKEN", e.alice).Replace(crossOriginPage)

		p, err := b.NewPage(ctx, 800, 600, "")
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close(ctx)
		if err := p.Navigate(ctx, ui.URL+"/"); err != nil {
			t.Fatal(err)
		}
		if err := p.WaitFor(ctx, "window.__joined && window.__joined.ok"); err != nil {
			var state any
			_ = p.Eval(context.Background(), "JSON.stringify({joined: window.__joined, refused: window.__refused, disconnect: window.__disc})", &state)
			t.Fatalf("%v; page: %v", err, state)
		}
		e.registerJob(e.alice, "r", "modifiers", "Rotate")
		if err := p.WaitFor(ctx, "window.__refetch.length > 0"); err != nil {
			t.Fatal(err)
		}
		var got []struct {
			Status int
			Error  string
			Body   struct {
				Items []struct {
					FullName string `json:"full_name"`
				}
			}
		}
		if err := p.Eval(ctx, "window.__refetch", &got); err != nil {
			t.Fatal(err)
		}
		if g := got[0]; g.Status != 200 || len(g.Body.Items) != 1 || g.Body.Items[0].FullName != "r:modifiers:Rotate" {
			t.Fatalf("refetch after jobs_invalidate: %+v", g)
		}

		var probe struct {
			Submit struct {
				Status   int
				Location string
			}
			Missing struct {
				Status int
				Type   string
			}
			CookieMode string
		}
		if err := p.Eval(ctx, "window.probe()", &probe); err != nil {
			t.Fatal(err)
		}
		if probe.Submit.Status != 202 || !strings.Contains(probe.Submit.Location, "/v1/joblib/tasks/") {
			t.Errorf("submit from the page: %+v (Location must be exposed)", probe.Submit)
		}
		if probe.Missing.Status != 404 || probe.Missing.Type != "/v1/problems/job-not-found" {
			t.Errorf("problem read from the page: %+v", probe.Missing)
		}
		if probe.CookieMode != "refused" {
			t.Errorf("a credentials-mode (cookie) answer was readable cross-origin: %s", probe.CookieMode)
		}
	})
}
