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
	"github.com/zndraw/joblib/internal/clientaddr"
	"github.com/zndraw/joblib/internal/limits"
	"github.com/zndraw/joblib/internal/lru"
	"github.com/zndraw/joblib/internal/ratelimit"
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
//
// A session id names its node run, so anybody can make up ids of runs that
// do not exist. Such lookups stay cheap: a run found not live is remembered
// for unknownTTL (in a bounded LRU, apart from the live runs so that made-up
// ids never push a real node out), and the lookups of runs in neither cache
// are a per-client-address budget; past it the request is refused without
// asking the database.
type forwarder struct {
	svc     *joblib.Service
	run     string
	local   func(sid string) bool
	next    http.Handler
	log     *slog.Logger
	proxy   *httputil.ReverseProxy
	lookups *ratelimit.Limiter[string] // per client address
	reject  func(limit string)

	forwarded atomic.Int64
	looked    atomic.Int64 // node lookups in the database

	mu      sync.Mutex
	addrs   map[string]cachedAddr         // live runs
	unknown *lru.Cache[string, time.Time] // runs found not live, until when
}

type cachedAddr struct {
	addr  string
	until time.Time
}

type targetKey struct{}

// addrTTL is how long a node's advertised address is cached.
const addrTTL = 5 * time.Second

// unknownTTL is how long a run found not live is remembered. A node's lease
// exists before it hands out its first session id, so a live node is never
// remembered as unknown unless its lease lapsed (a database outage on that
// node); once renewed, it is found again within this time.
const unknownTTL = time.Second

// unknownMax bounds the runs remembered as not live.
const unknownMax = 4096

// Each client address may look up lookupBurst runs in neither cache at once,
// and lookupRate more per second. A client only ever meets a handful of
// runs (the nodes), cached for addrTTL, so this refuses made-up ids only.
const (
	lookupRate  = 5
	lookupBurst = 20
)

func newForwarder(svc *joblib.Service, local func(string) bool, next http.Handler, log *slog.Logger, reject func(string)) *forwarder {
	f := &forwarder{svc: svc, run: svc.Node().Run, local: local, next: next, log: log, reject: reject,
		addrs: map[string]cachedAddr{}, unknown: lru.New[string, time.Time](unknownMax),
		lookups: ratelimit.New[string](lookupRate, lookupBurst)}
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
	addr, err := f.addr(r.Context(), run, clientaddr.Of(r))
	if err != nil {
		f.reject(limits.SessionLookups)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"code":1,"message":"Session ID unknown (too many unknown sessions from this address)"}`))
		return
	}
	if addr == "" {
		f.next.ServeHTTP(w, r) // unknown session: the client reconnects
		return
	}
	f.forwarded.Add(1)
	target := &url.URL{Scheme: "http", Host: addr}
	f.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), targetKey{}, target)))
}

// errLookupBudget refuses a lookup past the client address's budget.
var errLookupBudget = errors.New("too many session lookups from this address")

// addr is the advertised address of a live node run ("" if none), looked
// up in the database at the cost of one of client's lookups when neither
// cache knows the run.
func (f *forwarder) addr(ctx context.Context, run, client string) (string, error) {
	now := time.Now()
	f.mu.Lock()
	c, ok := f.addrs[run]
	until, unknown := f.unknown.Get(run)
	f.mu.Unlock()
	if ok && now.Before(c.until) {
		return c.addr, nil
	}
	if unknown && now.Before(until) {
		return "", nil
	}
	if !ok {
		// A run that was live before is what a real client asks about.
		if allowed, _ := f.lookups.Allow(client); !allowed {
			return "", errLookupBudget
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	f.looked.Add(1)
	n, err := f.svc.LiveNode(ctx, run)
	if err != nil && !errors.Is(err, models.ErrNotFound) {
		f.log.Warn("look up node for a forwarded session", "run", run, "err", err)
		return "", nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		delete(f.addrs, run)
		f.unknown.Put(run, now.Add(unknownTTL))
		return "", nil
	}
	f.unknown.Remove(run)
	if len(f.addrs) > 1024 {
		clear(f.addrs) // only live runs get here: nodes, not made-up ids
	}
	f.addrs[run] = cachedAddr{addr: n.Addr, until: now.Add(addrTTL)}
	return n.Addr, nil
}
