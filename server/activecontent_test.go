package server

import "testing"

// Which provider content types are served inert: the media type is parsed
// (case, parameters, spaces), +xml and every JavaScript spelling count, and
// a type that does not parse is treated as active.
func TestActiveContent(t *testing.T) {
	t.Parallel()
	active := []string{
		"text/html", "TEXT/HTML", " text/html ; charset=utf-8", "text/html;charset=UTF-8",
		"application/xhtml+xml", "image/svg+xml", "Image/SVG+XML; charset=utf-8", "text/xml", "application/xml",
		"application/rss+xml", "application/atom+xml", "application/mathml+xml", "application/xslt+xml", "text/xsl",
		"application/xml-dtd", "text/javascript", "application/javascript", "application/x-javascript",
		"text/ecmascript", "application/ecmascript", "text/jscript", "text/livescript", "text/javascript1.5",
		"application/pdf", "application/x-shockwave-flash", "multipart/x-mixed-replace; boundary=x",
		"message/rfc822", "multipart/related", "application/x-mimearchive", "text/x-component", "application/hta",
		"unknown/unknown", "application/unknown", "*/*", "text/*",
		"", "text/html;;", "texthtml", "text/", "/html", "text/html; charset=\"unterminated",
	}
	passive := []string{
		"application/json", "application/json; charset=utf-8", "application/problem+json", "application/octet-stream",
		"text/plain", "text/csv", "image/png", "image/jpeg", "image/webp", "audio/ogg", "video/mp4",
		"application/x-msgpack", "application/vnd.apache.arrow.stream", "font/woff2", "text/css",
	}
	for _, ct := range active {
		if !activeContent(ct) {
			t.Errorf("%q served as passive", ct)
		}
	}
	for _, ct := range passive {
		if activeContent(ct) {
			t.Errorf("%q served as active", ct)
		}
	}
}
