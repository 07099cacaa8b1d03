// Package web holds the live dashboard's static files (plain HTML, CSS and
// JavaScript, no build step), embedded in the binary and served at /ui/.
package web

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed ui docs
var files embed.FS

// UI is the dashboard's files: index.html, app.css, app.js, sio.js.
var UI fs.FS = mustSub(files, "ui")

// Docs is the API page's files (index.html, docs.css, docs.js): it renders
// /openapi.json.
var Docs fs.FS = mustSub(files, "docs")

func mustSub(f fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(f, dir)
	if err != nil {
		panic(err)
	}
	return sub
}

// contentSecurityPolicy allows the page's own files and its Socket.IO
// connection only: no inline script, nothing from elsewhere, no framing.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the files (mount it with the /ui prefix stripped). Every
// answer must be revalidated, so that an upgraded binary's page is used at
// once.
func Handler() http.Handler { return static(UI) }

// DocsHandler serves the API page (mount it with the /docs prefix stripped),
// under the same policy as the dashboard.
func DocsHandler() http.Handler { return static(Docs) }

func static(files fs.FS) http.Handler {
	fsrv := http.FileServerFS(files)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Cache-Control", "no-cache")
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		fsrv.ServeHTTP(w, r)
	})
}
