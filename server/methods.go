package server

import (
	"net/http"
	"strings"
)

// routesMethods answers a wrong method on the endpoints that share their
// path's shape with a wildcard route (POST /tasks/claim beside
// GET /tasks/{id}): without these, GET /tasks/claim would be read as a
// task id and answer 422. Every other wrong method gets the mux's 405,
// which also lists the allowed methods in Allow.
func (s *Server) routesMethods() {
	for _, path := range []string{"/tasks/claim", "/tasks/claim-batch", "/tasks/update-batch"} {
		for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodPatch, http.MethodDelete} {
			s.mux.HandleFunc(m+" "+prefix+path, methodNotAllowed(http.MethodPost))
		}
	}
	// The root points a browser at the dashboard.
	s.mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ui/", http.StatusFound) })
}

// methodNotAllowed answers 405 with the allowed methods.
func methodNotAllowed(allow ...string) http.HandlerFunc {
	list := strings.Join(allow, ", ")
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", list)
		writeProblem(w, Problem{Type: "/v1/problems/method-not-allowed", Title: http.StatusText(http.StatusMethodNotAllowed),
			Status: http.StatusMethodNotAllowed, Detail: r.Method + " is not allowed on this endpoint; allowed: " + list})
	}
}
