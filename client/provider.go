package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/zndraw/joblib/internal/canonical"
)

// ProviderHandler answers one read of a provider: params are the reader's
// query parameters (every value a string). The returned bytes are the
// result, stored verbatim and served with the provider's content type (a
// JSON provider returns JSON). An error uploads nothing: readers get 504
// and retry, and the error is logged.
type ProviderHandler func(ctx context.Context, params map[string]string) ([]byte, error)

// ProviderSpec names a provider to register.
type ProviderSpec struct {
	Room, Category, Name string
	Schema               any    // nil means {}
	ContentType          string // "" means application/json
}

// Provider is a registered data provider.
type Provider struct {
	ID        string          `json:"id"`
	RoomID    string          `json:"room_id"`
	Category  string          `json:"category"`
	Name      string          `json:"name"`
	FullName  string          `json:"full_name"`
	Schema    json.RawMessage `json:"schema"`
	WorkerID  *string         `json:"worker_id"`
	CreatedAt time.Time       `json:"created_at"`
}

// providerReg is a provider as the client registered it, with the id the
// server gave it last.
type providerReg struct {
	spec     ProviderSpec
	handler  ProviderHandler
	fullName string
	id       string // guarded by Client.mu
}

// RequestHash is the identity the server gives a provider read of params:
// the SHA-256 of their canonical JSON, as the Python server computes it. Run
// names each upload with it, so handlers never deal with it.
func RequestHash(params map[string]string) string { return canonical.RequestHash(params) }

// RegisterProvider registers a data provider served by the client's worker
// (registering a worker first when there is none). Run answers its
// provider_request events with h and uploads the results.
func (c *Client) RegisterProvider(ctx context.Context, spec ProviderSpec, h ProviderHandler) (*Provider, error) {
	if h == nil {
		return nil, errors.New("register provider: a handler is required")
	}
	if spec.Schema == nil {
		spec.Schema = map[string]any{}
	}
	wid, err := c.ensureWorker(ctx)
	if err != nil {
		return nil, fmt.Errorf("register provider %s:%s:%s: %w", spec.Room, spec.Category, spec.Name, err)
	}
	reg := &providerReg{spec: spec, handler: h}
	p, err := c.putProvider(ctx, wid, reg)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.providers = append(c.providers, reg)
	c.mu.Unlock()
	return p, nil
}

func (c *Client) putProvider(ctx context.Context, wid string, reg *providerReg) (*Provider, error) {
	s := reg.spec
	body := map[string]any{"category": s.Category, "name": s.Name, "schema": s.Schema, "worker_id": wid}
	if s.ContentType != "" {
		body["content_type"] = s.ContentType
	}
	var p Provider
	if err := c.do(ctx, http.MethodPut, "/rooms/"+url.PathEscape(s.Room)+"/providers", body, &p); err != nil {
		return nil, fmt.Errorf("register provider %s:%s:%s: %w", s.Room, s.Category, s.Name, err)
	}
	c.mu.Lock()
	reg.id, reg.fullName = p.ID, p.FullName
	c.mu.Unlock()
	return &p, nil
}

// Read reads a provider's data as a UI does: GET with params as the query.
// The server answers from its cache or asks the provider's workers and
// waits up to wait (whole seconds, capped by the server; 0 means the
// server's default). A provider that does not answer in time is an error
// matching ErrProviderTimeout.
func (c *Client) Read(ctx context.Context, room, fullName string, params map[string]string, wait time.Duration) ([]byte, error) {
	q := url.Values{}
	for k, v := range params {
		q.Set(k, v)
	}
	path := "/rooms/" + url.PathEscape(room) + "/providers/" + url.PathEscape(fullName)
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	hdr := http.Header{}
	if wait > 0 {
		hdr.Set("Prefer", "wait="+strconv.Itoa(int((wait+time.Second-1)/time.Second)))
	}
	body, _, err := c.send(ctx, http.MethodGet, path, hdr, nil)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", fullName, err)
	}
	return body, nil
}

// providerRequest is the provider_request event.
type providerRequest struct {
	RequestID    string `json:"request_id"`
	ProviderName string `json:"provider_name"`
	Params       string `json:"params"`
}

// provider returns the registration serving fullName, nil when none does.
func (c *Client) provider(fullName string) *providerReg {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.providers {
		if p.fullName == fullName {
			return p
		}
	}
	return nil
}

// answer runs the handler for one provider_request and uploads its result
// under the request's hash, computed from the parameters.
func (c *Client) answer(ctx context.Context, reg *providerReg, ev providerRequest) {
	params := map[string]string{}
	if err := json.Unmarshal([]byte(ev.Params), &params); err != nil {
		c.log.Warn("joblib: provider request with unreadable params", "provider", ev.ProviderName, "err", err)
		return
	}
	body, err := runProvider(ctx, reg.handler, params)
	if err != nil {
		c.log.Warn("joblib: provider handler failed; readers will retry", "provider", ev.ProviderName, "err", err)
		return
	}
	c.mu.Lock()
	id, wid := reg.id, c.workerID
	c.mu.Unlock()
	hdr := http.Header{}
	hdr.Set("X-Request-Hash", RequestHash(params))
	ct := reg.spec.ContentType
	if ct == "" {
		ct = "application/json"
	}
	hdr.Set("Content-Type", ct)
	// The upload is sent even while stopping: readers are waiting for it.
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	_, _, err = c.send(uctx, http.MethodPost, "/providers/"+url.PathEscape(id)+"/results", hdr, bytes.NewReader(body))
	switch {
	case err == nil:
	case errors.Is(err, ErrNotFound) && ctx.Err() == nil:
		// The provider is gone with its worker: register both again.
		if rerr := c.reregister(ctx, wid); rerr != nil {
			c.log.Warn("joblib: re-registration failed", "err", rerr)
		}
	default:
		c.log.Warn("joblib: provider upload failed", "provider", ev.ProviderName, "err", err)
	}
}

func runProvider(ctx context.Context, h ProviderHandler, params map[string]string) (body []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("provider handler panic: %v", r)
		}
	}()
	return h(ctx, params)
}
