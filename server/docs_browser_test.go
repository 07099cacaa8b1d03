package server_test

import (
	"context"
	"encoding/json"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/zndraw/joblib/internal/browser"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// TestDocsPageInBrowser: /docs renders the embedded document in headless
// Chromium, with every documented endpoint listed, and loads nothing from
// another origin (the page's Content-Security-Policy allows only 'self').
func TestDocsPageInBrowser(t *testing.T) {
	t.Parallel()
	ctx, b := launchBrowser(t, time.Minute)
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		e := setup(t, db)
		var doc struct {
			Paths map[string]map[string]json.RawMessage `json:"paths"`
		}
		e.do("", "GET", "/openapi.json", nil).want(200).JSON(&doc)
		var want []string
		for path, item := range doc.Paths {
			for m := range item {
				if m != "parameters" {
					want = append(want, strings.ToUpper(m)+" "+path)
				}
			}
		}
		sort.Strings(want)
		if csp := e.do("", "GET", "/docs/", nil).want(200).Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
			t.Fatalf("/docs/ CSP %q", csp)
		}

		page, err := b.NewPage(ctx, 1100, 900, "light")
		if err != nil {
			t.Fatal(err)
		}
		defer page.Close(context.Background())
		if err := page.Navigate(ctx, e.url+"/docs"); err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 15*time.Second)
		defer wcancel()
		if err := page.WaitFor(wctx, `document.body.dataset.state === "ready"`); err != nil {
			var text string
			_ = page.Eval(ctx, `document.body.dataset.state + " | " + document.body.innerText.slice(0, 500)`, &text)
			t.Fatalf("%v: %s", err, text)
		}
		var got struct {
			Ops       []string
			Resources []string
			Problem   bool
		}
		if err := page.Eval(ctx, `({
		  ops: [...document.querySelectorAll("section.op[data-path]")].map(s => s.dataset.method + " " + s.dataset.path).sort(),
		  resources: performance.getEntriesByType("resource").map(r => r.name),
		  problem: !!document.getElementById("schema-Problem") && document.getElementById("schema-Problem").innerText.includes("validation-error"),
		})`, &got); err != nil {
			t.Fatal(err)
		}
		if strings.Join(got.Ops, "\n") != strings.Join(want, "\n") {
			t.Fatalf("page lists\n%s\nwant\n%s", strings.Join(got.Ops, "\n"), strings.Join(want, "\n"))
		}
		if !got.Problem {
			t.Fatal("the Problem schema with its types is not shown")
		}
		for _, r := range got.Resources {
			if !strings.HasPrefix(r, e.url+"/") {
				t.Fatalf("page loaded %s from elsewhere", r)
			}
		}
		if len(want) < 25 {
			t.Fatalf("only %d endpoints documented", len(want))
		}
	})
}

// launchBrowser starts headless Chromium for the test, closed at its end,
// and a context that bounds the test's browser work.
func launchBrowser(t *testing.T, d time.Duration) (context.Context, *browser.Browser) {
	t.Helper()
	bin, err := browser.Find()
	if err != nil {
		t.Fatalf("%v (scripts/test.sh installs Debian's chromium)", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	b, err := browser.Launch(ctx, bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return ctx, b
}
