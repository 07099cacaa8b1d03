package server

import (
	"context"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/joblib"
)

func (s *Server) routesProviders(list, write func(http.HandlerFunc) http.HandlerFunc) {
	m := s.routeMux()
	m.HandleFunc("PUT "+prefix+"/rooms/{room}/providers", write(s.registerProvider))
	m.HandleFunc("GET "+prefix+"/rooms/{room}/providers", list(s.listProviders))
	m.HandleFunc("GET "+prefix+"/rooms/{room}/providers/{name...}", s.providerInfoOrRead)
	m.HandleFunc("DELETE "+prefix+"/providers/{id}", write(s.deleteProvider))
	m.HandleFunc("POST "+prefix+"/providers/{id}/results", write(s.uploadProviderResult))
}

type registerProviderBody struct {
	Category    *string         `json:"category"`
	Name        *string         `json:"name"`
	Schema      json.RawMessage `json:"schema"`
	SchemaAlias json.RawMessage `json:"schema_"`
	ContentType *string         `json:"content_type"`
	WorkerID    *uuid.UUID      `json:"worker_id"`
}

func (s *Server) registerProvider(w http.ResponseWriter, r *http.Request) {
	room, p, ok := s.roomThenPrincipal(w, r, accessWrite)
	if !ok {
		return
	}
	var b registerProviderBody
	if !s.decodeBody(w, r, &b) {
		return
	}
	if b.Category == nil || b.Name == nil {
		badRequest(w, `fields "category" and "name" are required strings`)
		return
	}
	schema, ok := schemaOf(w, b.Schema, b.SchemaAlias)
	if !ok {
		return
	}
	var contentType string
	if b.ContentType != nil && *b.ContentType != "" {
		if _, _, err := mime.ParseMediaType(*b.ContentType); err != nil {
			badRequest(w, `field "content_type" must be a media type such as application/json`)
			return
		}
		contentType = *b.ContentType
	}
	prov, created, err := s.svc.RegisterProvider(r.Context(), p, room, joblib.RegisterProviderParams{
		Category: *b.Category, Name: *b.Name, Schema: schema, ContentType: contentType, WorkerID: b.WorkerID,
	})
	s.answer(w, r, createdOrOK(created), prov, err)
}

func (s *Server) listProviders(w http.ResponseWriter, r *http.Request) {
	pg, ok := s.pageParams(w, r)
	if !ok {
		return
	}
	out, err := s.svc.ListProviders(r.Context(), r.PathValue("room"), pg)
	s.answer(w, r, http.StatusOK, out, err)
}

// providerInfoOrRead serves /providers/{full_name}/info (metadata, a read
// like the other GETs) and /providers/{full_name} (a data read, always
// authenticated). The name may contain '/'; like the contract, the /info
// suffix wins.
func (s *Server) providerInfoOrRead(w http.ResponseWriter, r *http.Request) {
	// A provider's bytes are another user's, served from the API's origin:
	// every answer here (bytes, info, refusals) tells the browser to take
	// the declared type as it is; see also safeProviderAnswer.
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if name, ok := strings.CutSuffix(r.PathValue("name"), "/info"); ok {
		s.read(func(w http.ResponseWriter, r *http.Request) {
			out, err := s.svc.ProviderInfo(r.Context(), r.PathValue("room"), name)
			s.answer(w, r, http.StatusOK, out, err)
		})(w, r)
		return
	}
	s.readProvider(w, r)
}

// readProvider answers a provider read with the provider's bytes, or 504
// ProviderTimeout with Retry-After: 2 when none arrived in time.
func (s *Server) readProvider(w http.ResponseWriter, r *http.Request) {
	room, p, ok := s.roomThenPrincipal(w, r, accessRead)
	if !ok {
		return
	}
	params, err := readParams(r.URL.RawQuery)
	if err != nil {
		badRequest(w, err.Error())
		return
	}
	var wait *time.Duration
	if d, ok := parsePreferWait(r.Header.Get("Prefer")); ok {
		wait = &d
	}
	out, err := s.svc.ReadProviderAs(r.Context(), p, room, r.PathValue("name"), params, wait)
	if err != nil {
		if joblib.IsCode(err, joblib.CodeProviderTimeout) {
			w.Header().Set("Retry-After", "2")
		}
		s.fail(w, r, err)
		return
	}
	safeProviderAnswer(w.Header(), out.ContentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(out.Body)))
	if out.Waited {
		w.Header().Set("Preference-Applied", "wait="+strconv.FormatFloat(out.Timeout.Seconds(), 'f', -1, 64))
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out.Body)
}

// safeProviderAnswer sets the headers of a provider's bytes (nosniff is
// already set, by providerInfoOrRead): its content type and, for a type a
// browser would run as a page or a script, a sandbox and a download. Every
// read answer (cached, waited for, uploaded through another node) goes
// through here.
func safeProviderAnswer(h http.Header, contentType string) {
	h.Set("Content-Type", contentType)
	if activeContent(contentType) {
		// A page opened from the link runs with no origin (no cookies, no
		// same-origin requests, no scripts); a navigation downloads it.
		h.Set("Content-Security-Policy", "sandbox")
		h.Set("Content-Disposition", "attachment")
	}
}

// activeSubtypes are media subtypes (of any top-level type) a browser
// renders as a document that can run script, or runs as script.
var activeSubtypes = map[string]bool{
	"html": true, "xhtml": true, "xml": true, "xsl": true, "xslt": true, "svg": true, "pdf": true,
	"x-shockwave-flash": true, "futuresplash": true, "x-component": true, "hta": true, "x-mimearchive": true,
}

// activeContent reports whether a browser could run content of this media
// type: HTML, XHTML, XML and every +xml type (SVG, XSLT, MathML, RSS...),
// JavaScript and ECMAScript in all their spellings, PDF, Flash, MHTML and
// the multipart and message types (which carry pages), and the
// "unknown" types browsers sniff. The type is parsed (case, parameters and
// spaces do not matter); one that does not parse counts as active.
func activeContent(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return true
	}
	typ, sub, ok := strings.Cut(mt, "/")
	if !ok || typ == "" || sub == "" || strings.Contains(mt, "*") {
		return true
	}
	switch {
	case typ == "multipart", typ == "message":
		return true
	case activeSubtypes[sub], strings.HasSuffix(sub, "+xml"), strings.HasPrefix(sub, "xml-"):
		return true
	case strings.Contains(sub, "javascript"), strings.Contains(sub, "ecmascript"),
		strings.Contains(sub, "jscript"), strings.Contains(sub, "livescript"):
		return true
	case sub == "unknown":
		return true
	}
	return false
}

type paramError string

func (e paramError) Error() string { return string(e) }

// readParams flattens a query string into read parameters the way the Python
// server did (urllib's parse_qsl with blank values kept: '&'-separated pairs,
// '+' as space, %XX decoded, malformed escapes kept literally, a pair without
// '=' has the value "", the last of repeated keys wins). Parameters must be
// UTF-8 text once decoded: anything else is refused rather than hashed.
func readParams(raw string) (map[string]string, error) {
	out := map[string]string{}
	for _, pair := range strings.Split(raw, "&") {
		if pair == "" {
			continue
		}
		k, v, _ := strings.Cut(pair, "=")
		k, v = unquotePlus(k), unquotePlus(v)
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return nil, paramError("query parameters must be UTF-8 text")
		}
		out[k] = v
	}
	return out, nil
}

// unquotePlus is Python's urllib.parse.unquote_plus without the UTF-8
// repair: '+' becomes a space, valid %XX escapes become bytes, others stay.
func unquotePlus(s string) string {
	if !strings.ContainsAny(s, "+%") {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '+':
			b.WriteByte(' ')
		case c == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]):
			b.WriteByte(unhex(s[i+1])<<4 | unhex(s[i+2]))
			i += 2
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

func (s *Server) deleteProvider(w http.ResponseWriter, r *http.Request) {
	p, ok := s.principal(w, r)
	if !ok {
		return
	}
	id, ok := pathUUID(w, r, "id")
	if !ok {
		return
	}
	if err := s.svc.DeleteProvider(r.Context(), p, id); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// uploadProviderResult stores a provider's answer: the raw body, for the
// request named by X-Request-Hash.
func (s *Server) uploadProviderResult(w http.ResponseWriter, r *http.Request) {
	p, ok := s.principal(w, r)
	if !ok {
		return
	}
	id, ok := pathUUID(w, r, "id")
	if !ok {
		return
	}
	hash := r.Header.Get("X-Request-Hash")
	if hash == "" {
		badRequest(w, "header X-Request-Hash is required")
		return
	}
	body := &budgetReader{r: r.Body, ctx: r.Context()}
	if err := s.svc.UploadProviderResult(r.Context(), p, id, hash, body); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// budgetReader restarts the request's database time budget once the body
// has been read to its end, so that a slow upload does not spend it.
type budgetReader struct {
	r             io.Reader
	ctx           context.Context
	started, done bool
}

func (b *budgetReader) Read(p []byte) (int, error) {
	if !b.started {
		b.started = true
		pauseBudget(b.ctx)
	}
	n, err := b.r.Read(p)
	if err != nil && !b.done {
		b.done = true
		restartBudget(b.ctx)
	}
	return n, err
}
