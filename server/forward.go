package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server/sio/engineio"
)

// Session ids name their node: a random part, a dot, and the node run (its
// UUID without dashes). A request for a session that lives on another node
// (a load balancer without stickiness sent it here) is forwarded to that
// node's advertised address, so any balancing works.

// forwardedHeader marks a request one node forwarded to another: it is never
// forwarded again.
const forwardedHeader = "X-Joblib-Forwarded"

// nodeSessionID returns the session id generator of a node run.
func nodeSessionID(run string) func() string {
	key := strings.ReplaceAll(run, "-", "")
	return func() string { return engineio.RandomID() + "." + key }
}

// sessionRun returns the node run named in a session id.
func sessionRun(sid string) (string, bool) {
	i := strings.LastIndexByte(sid, '.')
	if i < 0 {
		return "", false
	}
	id, err := uuid.Parse(sid[i+1:])
	if err != nil {
		return "", false
	}
	return id.String(), true
}

// forwarder sends Engine.IO requests (polling, and the websocket upgrade of
// a polling session) for sessions of other nodes to their node.
type forwarder struct {
	svc   *joblib.Service
	run   string
	local func(sid string) bool
	next  http.Handler
	log   *slog.Logger
	proxy *httputil.ReverseProxy

	forwarded atomic.Int64

	mu    sync.Mutex
	addrs map[string]cachedAddr
}

type cachedAddr struct {
	addr  string
	until time.Time
}

type targetKey struct{}

// addrTTL is how long a node's advertised address is cached.
const addrTTL = 5 * time.Second

func newForwarder(svc *joblib.Service, local func(string) bool, next http.Handler, log *slog.Logger) *forwarder {
	f := &forwarder{svc: svc, run: svc.Node().Run, local: local, next: next, log: log, addrs: map[string]cachedAddr{}}
	f.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(pr.In.Context().Value(targetKey{}).(*url.URL))
			pr.Out.Host = pr.In.Host // the origin check compares with the client's host
			pr.SetXForwarded()
			pr.Out.Header.Set(forwardedHeader, "1")
		},
		FlushInterval: -1, // long-polls and websocket frames pass at once
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if !errors.Is(err, context.Canceled) {
				log.Warn("forward socket request", "err", err)
			}
			// The node is gone: the session with it. The client reconnects.
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"code":1,"message":"Session ID unknown"}`))
		},
	}
	return f
}

func (f *forwarder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sid := r.URL.Query().Get("sid")
	if sid == "" || r.Header.Get(forwardedHeader) != "" || f.local(sid) {
		f.next.ServeHTTP(w, r)
		return
	}
	run, ok := sessionRun(sid)
	if !ok || run == f.run {
		f.next.ServeHTTP(w, r)
		return
	}
	addr := f.addr(r.Context(), run)
	if addr == "" {
		f.next.ServeHTTP(w, r) // unknown session: the client reconnects
		return
	}
	f.forwarded.Add(1)
	target := &url.URL{Scheme: "http", Host: addr}
	f.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), targetKey{}, target)))
}

// addr is the advertised address of a live node run ("" if none).
func (f *forwarder) addr(ctx context.Context, run string) string {
	now := time.Now()
	f.mu.Lock()
	c, ok := f.addrs[run]
	f.mu.Unlock()
	if ok && now.Before(c.until) {
		return c.addr
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	n, err := f.svc.LiveNode(ctx, run)
	if err != nil && !errors.Is(err, models.ErrNotFound) {
		f.log.Warn("look up node for a forwarded session", "run", run, "err", err)
		return ""
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.addrs) > 1024 {
		clear(f.addrs)
	}
	f.addrs[run] = cachedAddr{addr: n.Addr, until: now.Add(addrTTL)}
	return n.Addr
}
