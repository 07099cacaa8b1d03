package server

import (
	"net/http"

	"github.com/zndraw/joblib/joblib"
)

// CORS for the REST API (/v1/...): a UI on another origin listed in
// JOBLIB_ALLOWED_ORIGINS calls it with its token in the Authorization
// header.
//
// Access-Control-Allow-Credentials is never sent. A token in a header does
// not need credentials mode, and without that header a browser neither
// sends the joblib_token cookie on a preflighted cross-origin request nor
// lets a page read the answer to one it sent with the cookie: the
// cookie stays a same-origin credential, and cookie-authenticated writes
// from other origins stay refused (see checkCookieWrite for the requests
// that are not preflighted).
const (
	corsAllowMethods  = "GET, HEAD, POST, PUT, PATCH, DELETE"
	corsAllowHeaders  = "Authorization, Content-Type, Idempotency-Key, Prefer"
	corsExposeHeaders = "Location, Retry-After, Preference-Applied, Idempotent-Replayed"
	// corsMaxAge is how long (seconds) a browser may reuse a preflight's
	// answer; Chromium caps it at 7200.
	corsMaxAge = "600"
)

// cors adds the CORS headers of a REST request from an allowed origin before
// its handler runs (so that problem+json answers carry them too) and
// answers a preflight itself, returning true. A request without an Origin,
// or from an origin not allowed, gets no allow headers.
func (s *Server) cors(w http.ResponseWriter, r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return false
	}
	h := w.Header()
	h.Add("Vary", "Origin")
	allowed := s.originAllowed(r, origin)
	if allowed {
		h.Set("Access-Control-Allow-Origin", origin)
	}
	if r.Method != http.MethodOptions || r.Header.Get("Access-Control-Request-Method") == "" {
		if allowed {
			h.Set("Access-Control-Expose-Headers", corsExposeHeaders)
		}
		return false
	}
	if !allowed {
		s.fail(w, r, &joblib.Error{Code: joblib.CodeForbidden,
			Detail: "Origin " + origin + " is not allowed: list it in JOBLIB_ALLOWED_ORIGINS"})
		return true
	}
	h.Set("Access-Control-Allow-Methods", corsAllowMethods)
	h.Set("Access-Control-Allow-Headers", corsAllowHeaders)
	h.Set("Access-Control-Max-Age", corsMaxAge)
	w.WriteHeader(http.StatusNoContent)
	return true
}
