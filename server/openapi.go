package server

import (
	_ "embed"
	"net/http"
	"slices"

	"github.com/zndraw/joblib/web"
)

// openAPIDocument is the OpenAPI 3.1 description of every REST endpoint
// (parameters, bodies, answers, problem types). The server tests validate
// every answer they receive against it, so that it cannot drift from the
// handlers: a new route, field or status code needs its entry here.
//
//go:embed openapi.json
var openAPIDocument []byte

// OpenAPI returns the embedded OpenAPI document (JSON).
func OpenAPI() []byte { return slices.Clone(openAPIDocument) }

func (s *Server) routesOpenAPI() {
	m := s.routeMux()
	m.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-cache")
		_, _ = w.Write(openAPIDocument)
	})
	docs := web.DocsHandler()
	m.Handle("GET /docs/", http.StripPrefix("/docs", docs))
	m.HandleFunc("GET /docs", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/docs/", http.StatusMovedPermanently)
	})
}

// routeMux is the server's mux as the route functions register on it: each
// pattern is also recorded, so that a test can check that every route is in
// the OpenAPI document.
func (s *Server) routeMux() routeRecorder { return routeRecorder{s} }

type routeRecorder struct{ s *Server }

func (m routeRecorder) HandleFunc(pattern string, h http.HandlerFunc) { m.Handle(pattern, h) }

func (m routeRecorder) Handle(pattern string, h http.Handler) {
	m.s.routesMu.Lock()
	m.s.patterns = append(m.s.patterns, pattern)
	m.s.routesMu.Unlock()
	m.s.mux.Handle(pattern, h)
}

// Routes returns the patterns registered on the server's mux, in order
// ("METHOD /path/{param}"), including those mounted later with Handle.
func (s *Server) Routes() []string {
	s.routesMu.Lock()
	defer s.routesMu.Unlock()
	return slices.Clone(s.patterns)
}
