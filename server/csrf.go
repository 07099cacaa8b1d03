package server

import (
	"mime"
	"net/http"
	"net/url"
	"path"
	"strings"

	"github.com/zndraw/joblib/joblib"
)

// cookieOnly reports whether the request's credential is the joblib_token
// cookie (no Authorization header), the one a browser attaches on its own to
// requests other sites make it send.
func cookieOnly(r *http.Request) bool {
	if r.Header.Get("Authorization") != "" {
		return false
	}
	_, err := r.Cookie(authCookie)
	return err == nil
}

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// checkCookieWrite refuses a state-changing request authenticated only by the
// cookie unless it comes from an allowed origin and carries a JSON content
// type. HTML forms and no-cors fetches cannot send application/json, and a
// cross-site fetch that can must name its origin.
func (s *Server) checkCookieWrite(r *http.Request) error {
	if safeMethod(r.Method) || !cookieOnly(r) {
		return nil
	}
	if !s.sameOrAllowedOrigin(r) {
		return &joblib.Error{Code: joblib.CodeForbidden,
			Detail: "Cross-site request refused: a cookie-authenticated write must come from this server's origin or one in JOBLIB_ALLOWED_ORIGINS (or use an Authorization header)"}
	}
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
		return &joblib.Error{Code: joblib.CodeForbidden,
			Detail: "A cookie-authenticated write must have Content-Type: application/json (or use an Authorization header)"}
	}
	return nil
}

// sameOrAllowedOrigin judges the request's Origin (same host as the request,
// or a match in AllowedOrigins, as for sockets); without an Origin header it
// trusts Sec-Fetch-Site, and a request with neither (not from a browser that
// would attach cookies on its own) passes.
func (s *Server) sameOrAllowedOrigin(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		switch r.Header.Get("Sec-Fetch-Site") {
		case "", "same-origin", "none":
			return true
		}
		return false
	}
	return s.originAllowed(r, origin)
}

// originAllowed reports whether a browser origin (an Origin header's value)
// is the request's own host or matches AllowedOrigins (host patterns such
// as "app.example.com" or "*.example.com", or with a scheme). "null"
// (sandboxed frames, file:, data:) never is.
func (s *Server) originAllowed(r *http.Request, origin string) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	if strings.EqualFold(u.Host, r.Host) {
		return true
	}
	for _, p := range s.cfg.AllowedOrigins {
		target := u.Host
		if strings.Contains(p, "://") {
			target = origin
		}
		if ok, _ := path.Match(strings.ToLower(p), strings.ToLower(target)); ok {
			return true
		}
	}
	return false
}
