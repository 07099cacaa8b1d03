package server_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	liberrors "github.com/pb33f/libopenapi-validator/errors"
	"github.com/pb33f/libopenapi-validator/helpers"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
)

// The contract check: every answer the harness (env.do) receives is
// validated against the embedded OpenAPI document by libopenapi-validator,
// and a mismatch (an undocumented status, content type, header or body
// shape) fails the request, so the test that sent it. TestMain logs how
// many answers were validated.

// apiClient is the harness's HTTP client.
var apiClient = &http.Client{Transport: newContractTransport(http.DefaultTransport)}

// notREST are the paths served beside the REST API that the document does
// not describe: the dashboard's and the API page's static files, Socket.IO,
// Prometheus.
var notREST = regexp.MustCompile(`^/(ui|docs)(/|$)|^/socket\.io/|^/metrics$`)

type contractTransport struct {
	base http.RoundTripper

	once sync.Once
	v    validator.Validator
	err  error
	mu   sync.Mutex // the validator's caches are not documented as safe for concurrent use

	validated atomic.Int64
}

func newContractTransport(base http.RoundTripper) *contractTransport {
	return &contractTransport{base: base}
}

func (c *contractTransport) validator() (validator.Validator, error) {
	c.once.Do(func() { c.v, c.err = newContractValidator() })
	return c.v, c.err
}

func newContractValidator() (validator.Validator, error) {
	doc, err := libopenapi.NewDocument(server.OpenAPI())
	if err != nil {
		return nil, fmt.Errorf("parse server/openapi.json: %w", err)
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		return nil, fmt.Errorf("server/openapi.json: %w", errors.Join(errs...))
	}
	if ok, verrs := v.ValidateDocument(); !ok {
		return nil, fmt.Errorf("server/openapi.json is not a valid OpenAPI document: %s", describe(verrs))
	}
	return v, nil
}

func (c *contractTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := c.base.RoundTrip(req)
	if err != nil || notREST.MatchString(req.URL.Path) || isPreflight(req) {
		return res, err
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		return nil, err
	}
	res.Body = io.NopCloser(bytes.NewReader(body))
	if err := c.check(req, res, body); err != nil {
		return nil, fmt.Errorf("answer %d breaks server/openapi.json: %w; body %.300s", res.StatusCode, err, body)
	}
	c.validated.Add(1)
	return res, nil
}

// isPreflight: a CORS preflight is the browser's question about an
// endpoint (answered by the CORS layer for every path, see cors_test.go),
// not a call of one.
func isPreflight(req *http.Request) bool {
	return req.Method == http.MethodOptions && req.Header.Get("Access-Control-Request-Method") != ""
}

// check validates one answer. A path or method the document does not have
// may only be answered by the router's own 404/405 problem.
func (c *contractTransport) check(req *http.Request, res *http.Response, body []byte) error {
	v, err := c.validator()
	if err != nil {
		return err
	}
	req = withNameEscaped(req)
	copyRes := *res
	copyRes.Body = io.NopCloser(bytes.NewReader(body))
	copyRes.Request = req
	c.mu.Lock()
	ok, verrs := v.ValidateHttpResponse(req, &copyRes)
	c.mu.Unlock()
	if ok {
		return nil
	}
	if unknownRoute(verrs) {
		return routingProblem(res, body)
	}
	return errors.New(describe(verrs))
}

// fullNamePath is a path that ends in a job's or provider's full name (and
// a sub-resource): the mux's {name...} takes the rest of the path, names
// with '/' included, where an OpenAPI template parameter is one segment.
var fullNamePath = regexp.MustCompile(`^(/v1/joblib/rooms/[^/]+/(?:jobs|providers|tasks)/)(.+?)(/tasks|/info|/batch)?$`)

// withNameEscaped returns req with the '/' of a full name in its path
// escaped as %2F (which the server accepts too), so that the document's
// one-segment {job} or {provider} parameter matches.
func withNameEscaped(req *http.Request) *http.Request {
	m := fullNamePath.FindStringSubmatch(req.URL.Path)
	if m == nil || !strings.Contains(m[2], "/") {
		return req
	}
	r := req.Clone(req.Context())
	r.URL.RawPath = m[1] + url.PathEscape(m[2]) + m[3]
	return r
}

func unknownRoute(verrs []*liberrors.ValidationError) bool {
	return len(verrs) > 0 && slices.ContainsFunc(verrs, func(e *liberrors.ValidationError) bool {
		return e.ValidationType == helpers.PathValidation &&
			(e.ValidationSubType == helpers.ValidationMissing || e.ValidationSubType == helpers.ValidationMissingOperation)
	})
}

// routingProblem accepts the router's answer for a path or method that has
// no endpoint: 404 not-found or 405 method-not-allowed, as problem+json.
func routingProblem(res *http.Response, body []byte) error {
	var p server.Problem
	want := map[int]string{404: "/v1/problems/not-found", 405: "/v1/problems/method-not-allowed"}[res.StatusCode]
	if want == "" || res.Header.Get("Content-Type") != "application/problem+json" || json.Unmarshal(body, &p) != nil || p.Type != want {
		return fmt.Errorf("%s is not in the document and the answer is not the router's 404/405 problem", res.Request.URL.Path)
	}
	return nil
}

func describe(verrs []*liberrors.ValidationError) string {
	var b strings.Builder
	for i, e := range verrs {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(e.Message)
		if e.Reason != "" {
			b.WriteString(": " + e.Reason)
		}
		for _, s := range e.SchemaValidationErrors {
			fmt.Fprintf(&b, " [%s: %s]", s.FieldPath, s.Reason)
		}
	}
	return b.String()
}

// TestOpenAPICoversEveryRoute: every route registered on the server's mux
// is in the document (with its method), apart from the static files,
// Socket.IO and Prometheus, and the document has no endpoint the server
// does not serve.
func TestOpenAPICoversEveryRoute(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		e := setup(t, db, withRealtime(server.RealtimeConfig{}))
		var doc struct {
			Paths map[string]map[string]json.RawMessage `json:"paths"`
		}
		r := e.do("", "GET", "/openapi.json", nil).want(200)
		r.JSON(&doc)
		documented := map[string]bool{}
		for path, item := range doc.Paths {
			for m := range item {
				if m != "parameters" {
					documented[strings.ToUpper(m)+" "+path] = true
				}
			}
		}
		served := map[string]bool{}
		for _, pattern := range e.api.Routes() {
			method, path, ok := strings.Cut(pattern, " ")
			if !ok {
				method, path = "GET", pattern
			}
			if notREST.MatchString(path) {
				continue
			}
			for _, p := range openAPIPaths(path) {
				served[method+" "+p] = true
				if !documented[method+" "+p] {
					t.Errorf("route %q is served but %s %s is not in server/openapi.json", pattern, method, p)
				}
			}
		}
		if len(served) < 20 {
			t.Fatalf("only %d routes recorded: %v", len(served), e.api.Routes())
		}
		for op := range documented {
			if !served[op] {
				t.Errorf("server/openapi.json documents %s, which no route serves", op)
			}
		}
	})
}

// openAPIPaths turns a mux pattern into the document's path(s): a trailing
// {name...} serves a job or provider by full name and its sub-resource.
func openAPIPaths(pattern string) []string {
	switch {
	case strings.HasSuffix(pattern, "/jobs/{name...}"):
		base := strings.TrimSuffix(pattern, "{name...}") + "{job}"
		return []string{base, base + "/tasks"}
	case strings.HasSuffix(pattern, "/providers/{name...}"):
		base := strings.TrimSuffix(pattern, "{name...}") + "{provider}"
		return []string{base, base + "/info"}
	case strings.HasSuffix(pattern, "/tasks/{name...}"):
		base := strings.TrimSuffix(pattern, "{name...}") + "{job}"
		return []string{base, base + "/batch"}
	}
	return []string{pattern}
}

// TestOpenAPIValidationFailsOnDrift: the transport refuses an answer whose
// body, status or content type the document does not describe.
func TestOpenAPIValidationFailsOnDrift(t *testing.T) {
	c := newContractTransport(nil)
	req, _ := http.NewRequest("GET", "http://x/v1/joblib/tasks/00000000-0000-4000-8000-000000000001", nil)
	answer := func(status int, ctype, body string) error {
		res := &http.Response{StatusCode: status, Header: http.Header{"Content-Type": {ctype}}, Request: req,
			Body: io.NopCloser(strings.NewReader(body))}
		return c.check(req, res, []byte(body))
	}
	task := `{"id":"00000000-0000-4000-8000-000000000001","job_name":"r:c:n","room_id":"r","status":"pending",` +
		`"created_at":"2026-11-23T20:01:37.031000Z","started_at":null,"completed_at":null,"worker_id":null,` +
		`"error":null,"payload":{},"queue_position":0,"attempt":0,"result":null,"task_timeout":null,"heartbeat_timeout":null,` +
		`"deadline_at":null,"progress":null,"progress_at":null}`
	if err := answer(200, "application/json", task); err != nil {
		t.Fatalf("a documented task was refused: %v", err)
	}
	for name, tc := range map[string][3]string{
		"undocumented field": {"200", "application/json", strings.Replace(task, `"attempt":0`, `"attempt":0,"extra":1`, 1)},
		"missing field":      {"200", "application/json", strings.Replace(task, `"attempt":0,`, ``, 1)},
		"wrong status value": {"200", "application/json", strings.Replace(task, `"pending"`, `"waiting"`, 1)},
		"undocumented code":  {"201", "application/json", task},
		"problem as json":    {"404", "application/json", `{"type":"/v1/problems/task-not-found","title":"Not Found","status":404}`},
		"unknown problem":    {"404", "application/problem+json", `{"type":"/v1/problems/nope","title":"Not Found","status":404}`},
	} {
		var status int
		fmt.Sscan(tc[0], &status)
		if err := answer(status, tc[1], tc[2]); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
