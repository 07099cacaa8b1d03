package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
)

// TestDashboardTrendsInBrowser: the dashboard's sparklines follow the work
// by push. With the page open, tasks are submitted (pending depth rises),
// claimed (claim latency appears), completed and failed (their per-minute
// points rise): each change shows in the page without a reload.
func TestDashboardTrendsInBrowser(t *testing.T) {
	t.Parallel()
	ctx, b := launchBrowser(t, 2*time.Minute)
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		e := setup(t, db, withRealtime(server.DefaultRealtimeConfig()))
		worker := e.seed()
		page, err := b.NewPage(ctx, 1280, 900, "light")
		if err != nil {
			t.Fatal(err)
		}
		defer page.Close(context.Background())
		wait := func(expr string) {
			t.Helper()
			wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			defer cancel()
			if err := page.WaitFor(wctx, expr); err != nil {
				var dump string
				_ = page.Eval(ctx, `document.body.dataset.state + " | " + document.getElementById("trends").innerText`, &dump)
				t.Fatalf("%v\npage: %s", err, dump)
			}
		}
		if err := page.Navigate(ctx, e.url+"/ui/"); err != nil {
			t.Fatal(err)
		}
		wait(`document.body.dataset.state === "login"`)
		if err := page.Eval(ctx, fmt.Sprintf(`(() => { document.getElementById("token").value = %q; document.getElementById("login-form").requestSubmit(); return true; })()`, e.admin), nil); err != nil {
			t.Fatal(err)
		}
		// The last point of a series is the current minute. The test can
		// cross a minute's end, so a count is the sum of the last two
		// points, a latency any of them, and a depth the later one seen.
		const recentJS = `((id) => document.getElementById("trend-" + id).dataset.points.split(",").slice(-2))`
		count := func(id string) string {
			return recentJS + `("` + id + `").reduce((n, v) => n + Number(v || 0), 0)`
		}
		seen := func(id string) string { return recentJS + `("` + id + `").some((v) => v !== "")` }
		depth := func(id string) string { return `((r) => r[1] !== "" ? r[1] : r[0])(` + recentJS + `("` + id + `"))` }
		wait(`document.body.dataset.state === "live" && ` + count("completed") + ` === 0 && ` + depth("pending") + ` === "0"`)
		var before struct{ Points string }
		if err := page.Eval(ctx, `({points: document.getElementById("trend-completed").dataset.points})`, &before); err != nil {
			t.Fatal(err)
		}

		ids := []string{e.submit(e.admin, "@global", rotate, nil), e.submit(e.admin, "@global", rotate, nil), e.submit(e.admin, "@global", rotate, nil)}
		wait(depth("pending") + ` === "3"`)
		for range ids {
			if e.claim(e.admin, worker) == nil {
				t.Fatal("nothing to claim")
			}
		}
		wait(seen("claim-p50") + ` && ` + seen("claim-p99") + ` && document.querySelectorAll("#trend-claim-p99 polyline").length > 0`)
		for _, id := range ids {
			e.patch(e.admin, id, "running").want(200)
		}
		e.patch(e.admin, ids[0], "completed").want(200)
		e.patch(e.admin, ids[1], "completed").want(200)
		e.do(e.admin, "PATCH", api+"/tasks/"+ids[2], map[string]any{"status": "failed", "error": "boom"}).want(200)
		wait(count("completed") + ` === 2 && ` + count("failed") + ` === 1`)
		var after struct {
			Points string
			Lines  int
		}
		if err := page.Eval(ctx, `({points: document.getElementById("trend-completed").dataset.points,
		  lines: document.querySelectorAll("#trend-completed polyline").length})`, &after); err != nil {
			t.Fatal(err)
		}
		if after.Points == before.Points || after.Lines == 0 {
			t.Fatalf("completed sparkline unchanged: %q -> %q (%d lines)", before.Points, after.Points, after.Lines)
		}
		// Deleting the worker is a cleanup (path graceful): its sparkline appears.
		e.do(e.admin, "DELETE", api+"/workers/"+worker, nil).want(204)
		wait(`document.getElementById("trend-cleanups-graceful") !== null && ` + count("cleanups-graceful") + ` === 1`)
	})
}
