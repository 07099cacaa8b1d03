package server

import (
	"bytes"
	"context"
	"errors"
	"hash/fnv"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// Home routing (PostgreSQL clusters). A worker's claims and status reports
// share statements with the same user's calls that meet them on one node
// (joblib's group commit). Spread by a load balancer over N nodes, each
// node groups only its share of a fleet, and the database pays each
// statement's fixed cost (start-up, commit, round trip) up to N times as
// often: the database, which every node shares, does more work per task
// the more nodes there are.
//
// So each user has a home node: of the live nodes' leases, the one whose
// run scores highest for the user id (rendezvous hashing, so a node joining
// or leaving moves only the users it wins or held). A node that receives a
// claim or a status report of a user homed elsewhere forwards the request
// there, one hop inside the cluster; the home node checks the credentials
// again and serves it. The extra work is the nodes', which scale out.
//
// Routing only ever moves work: every node can serve every call.
//   - A home node that cannot be reached (connection refused, no answer to
//     the dial within homeDialTimeout) is passed over for homeDownFor, and
//     the call is served where it arrived.
//   - A forwarded request is never forwarded again, so nodes that briefly
//     disagree about the live set lose grouping, never a call.
//   - Once the request has reached the home node it may have run there, so
//     it is never run a second time: the home node's answer is the
//     client's. A home node that stops answering (frozen) is answered 503
//     node-unavailable with Retry-After once its lease lapses (watch), so
//     its users wait no longer than its own clients, or at the latest after
//     homeResponseWait.

// Timings of home routing.
const (
	// homeNodesTTL is how long the list of live nodes is reused before a
	// hot call reads it again (one small query per node per TTL, only
	// while hot calls arrive).
	homeNodesTTL = 2 * time.Second
	// homeDownFor is how long a node that could not be reached is passed
	// over.
	homeDownFor = 5 * time.Second
	// homeDialTimeout bounds the connection to a home node.
	homeDialTimeout = time.Second
	// homeWatchEvery is how often the leases of the nodes that calls are
	// in flight to are read again (see homeRouter.inFlight).
	homeWatchEvery = time.Second
)

// homeResponseWait bounds the wait for a home node's answer: twice the
// request's database budget (JOBLIB_WRITE_DB_TIMEOUT; a minute without
// one). A home node that works answers within its budget, so one that has
// not answered by then has stopped (frozen, or its host gone).
func homeResponseWait(writeBudget time.Duration) time.Duration {
	if writeBudget <= 0 {
		return time.Minute
	}
	return 2 * writeBudget
}

// errHomeNodeUnavailable answers a forwarded call whose home node took the
// request and then did not answer.
var errHomeNodeUnavailable = errors.New("home node unavailable")

// homeNode is a live node that can be forwarded to.
type homeNode struct {
	run, addr string
}

type homeRouter struct {
	self  string // this node's run
	nodes func(context.Context) ([]models.NodeLease, error)
	auth  func(context.Context, string) (joblib.Principal, error)
	fail  func(http.ResponseWriter, *http.Request, error)
	// await is Service.AwaitNodeLease: it returns ErrNodeLeaseLost once
	// this node finds that its lease lapsed during a stall.
	await func(context.Context) error
	max   int64 // request bodies up to this size are forwarded
	log   *slog.Logger
	now   func() time.Time
	proxy *httputil.ReverseProxy

	forwarded atomic.Int64 // calls routed to their home node (fallbacks included)
	fallbacks atomic.Int64 // of those, served here because the home node could not be reached

	mu         sync.Mutex
	live       []homeNode
	readAt     time.Time // when live was read; zero: never
	refreshing bool
	down       map[string]time.Time                // runs passed over, until when
	flights    map[string]map[*homeFlight]struct{} // calls in flight per home run
	watching   bool                                // watch runs
}

// homeFlight is one call in flight to a home node.
type homeFlight struct {
	cancel context.CancelCauseFunc
}

// homeCall is what the proxy's hooks need of one forwarded call.
type homeCall struct {
	target *url.URL
	run    string
	body   []byte
	local  http.HandlerFunc
	header http.Header // the answer's headers set before forwarding
}

type homeCallKey struct{}

// homeDialError marks a failure to connect to the home node: nothing was
// sent, so the call can be served here.
type homeDialError struct{ err error }

func (e *homeDialError) Error() string { return "dial home node: " + e.err.Error() }
func (e *homeDialError) Unwrap() error { return e.err }

func newHomeRouter(svc *joblib.Service, cfg Config, log *slog.Logger, fail func(http.ResponseWriter, *http.Request, error), auth func(context.Context, string) (joblib.Principal, error)) *homeRouter {
	h := &homeRouter{self: svc.Node().Run, nodes: svc.Nodes, auth: auth, fail: fail, await: svc.AwaitNodeLease, max: cfg.MaxBodyBytes,
		log: log, now: time.Now, down: map[string]time.Time{}, flights: map[string]map[*homeFlight]struct{}{}}
	dialer := &net.Dialer{Timeout: homeDialTimeout, KeepAlive: 30 * time.Second}
	transport := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, &homeDialError{err}
			}
			return c, nil
		},
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: homeResponseWait(cfg.WriteDBTimeout),
	}
	h.proxy = &httputil.ReverseProxy{
		Transport: transport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			c := pr.In.Context().Value(homeCallKey{}).(*homeCall)
			pr.SetURL(c.target)
			pr.Out.Host = pr.In.Host // the origin checks compare with the client's host
			pr.SetXForwarded()
			pr.Out.Header.Set(forwardedHeader, "1")
			// A body the transport can send again: a request on a kept-alive
			// connection the home node had closed is retried on a new one.
			pr.Out.Body = io.NopCloser(bytes.NewReader(c.body))
			pr.Out.ContentLength = int64(len(c.body))
			pr.Out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(c.body)), nil }
		},
		ErrorHandler: h.forwardFailed,
	}
	return h
}

// routeHome wraps a hot call's handler with home routing, when it is on.
func (s *Server) routeHome(next http.HandlerFunc) http.HandlerFunc {
	if s.home == nil {
		return next
	}
	return s.home.route(next)
}

// HomeForwarded is the number of claims and status reports this node
// routed to their user's home node; HomeFallbacks those of them it served
// itself because the home node could not be reached.
func (s *Server) HomeForwarded() int64 {
	if s.home == nil {
		return 0
	}
	return s.home.forwarded.Load()
}

// HomeFallbacks: see HomeForwarded.
func (s *Server) HomeFallbacks() int64 {
	if s.home == nil {
		return 0
	}
	return s.home.fallbacks.Load()
}

// route serves next here, or forwards the request to its user's home node.
func (h *homeRouter) route(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(forwardedHeader) != "" {
			// A node already routed it. If this node stalled so long meanwhile
			// that its lease lapsed, the forwarding node has answered 503
			// (watch): a call read only now must not run after that answer.
			if errors.Is(h.await(r.Context()), joblib.ErrNodeLeaseLost) {
				h.fail(w, r, errHomeNodeUnavailable)
				return
			}
			next(w, r)
			return
		}
		// A node alone (or without its lease) has nowhere to route to: it
		// serves the call without authenticating it twice.
		live := h.liveNodes(r.Context())
		if len(live) < 2 {
			next(w, r)
			return
		}
		// Only a caller known here is routed; anything else is answered
		// here, by next, as it would be anywhere.
		p, refused := h.auth(r.Context(), tokenFrom(r))
		if refused != nil {
			next(w, r)
			return
		}
		n, ok := h.home(live, p.ID)
		if !ok {
			next(w, r)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, h.max+1))
		if err != nil || int64(len(body)) > h.max {
			// next answers the unreadable or oversized body.
			r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), r.Body))
			next(w, r)
			return
		}
		h.forwarded.Add(1)
		// The home node's answer carries every header of its own (CORS
		// included, from the same request): the ones set here would be
		// doubled. They are put back if the call is answered here.
		c := &homeCall{target: &url.URL{Scheme: "http", Host: n.addr}, run: n.run, body: body, local: next, header: w.Header().Clone()}
		clear(w.Header())
		ctx, done := h.inFlight(r.Context(), n.run)
		defer done()
		h.proxy.ServeHTTP(w, r.WithContext(context.WithValue(ctx, homeCallKey{}, c)))
	}
}

// inFlight registers a call forwarded to run: its context is cancelled
// with errHomeNodeUnavailable if run's lease lapses before it is answered
// (a frozen node's does within JOBLIB_NODE_LEASE_TIMEOUT), so its callers
// wait no longer than the node's own clients do. done ends the call.
func (h *homeRouter) inFlight(parent context.Context, run string) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(parent)
	h.mu.Lock()
	calls := h.flights[run]
	if calls == nil {
		calls = map[*homeFlight]struct{}{}
		h.flights[run] = calls
	}
	call := &homeFlight{cancel: cancel}
	calls[call] = struct{}{}
	if !h.watching {
		h.watching = true
		go h.watch()
	}
	h.mu.Unlock()
	return ctx, func() {
		h.mu.Lock()
		delete(calls, call)
		if len(calls) == 0 {
			delete(h.flights, run)
		}
		h.mu.Unlock()
		cancel(nil)
	}
}

// watch runs while calls are in flight: every homeWatchEvery it reads the
// node leases and cancels the calls forwarded to runs no longer live.
func (h *homeRouter) watch() {
	t := time.NewTicker(homeWatchEvery)
	defer t.Stop()
	for range t.C {
		h.mu.Lock()
		if len(h.flights) == 0 {
			h.watching = false
			h.mu.Unlock()
			return
		}
		h.mu.Unlock()
		// The same read keeps the homes fresh for the calls that arrive.
		ctx, cancel := context.WithTimeout(context.Background(), homeWatchEvery)
		live, err := h.readNodes(ctx)
		cancel()
		if err != nil {
			continue // the calls' own timeout still bounds them
		}
		h.mu.Lock()
		for run, calls := range h.flights {
			if live[run] {
				continue
			}
			for call := range calls {
				call.cancel(errHomeNodeUnavailable) // each leaves calls when it ends
			}
			h.passOverLocked(run)
		}
		h.mu.Unlock()
	}
}

// forwardFailed answers a forwarded call the proxy could not complete.
func (h *homeRouter) forwardFailed(w http.ResponseWriter, r *http.Request, err error) {
	c := r.Context().Value(homeCallKey{}).(*homeCall)
	if cause := context.Cause(r.Context()); cause != nil && !errors.Is(cause, errHomeNodeUnavailable) {
		return // the client left
	}
	h.passOver(c.run)
	maps.Copy(w.Header(), c.header)
	if _, dial := errors.AsType[*homeDialError](err); dial {
		// Nothing reached the home node: serve the call here.
		h.fallbacks.Add(1)
		h.log.Warn("home node unreachable: serving its users' calls here", "run", c.run, "addr", c.target.Host, "for", homeDownFor, "err", err)
		r.Body = io.NopCloser(bytes.NewReader(c.body))
		c.local(w, r)
		return
	}
	h.log.Warn("home node did not answer a forwarded call", "run", c.run, "addr", c.target.Host, "err", err)
	h.fail(w, r, errHomeNodeUnavailable)
}

// passOver leaves a node out of the homes for homeDownFor.
func (h *homeRouter) passOver(run string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.passOverLocked(run)
}

// passOverLocked is passOver with h.mu held.
func (h *homeRouter) passOverLocked(run string) {
	h.down[run] = h.now().Add(homeDownFor)
}

// home returns user's home node among live (liveNodes) when it is another
// node that can be forwarded to; ok is false when the call is to be served
// here.
func (h *homeRouter) home(live []homeNode, user uuid.UUID) (homeNode, bool) {
	now := h.now()
	h.mu.Lock()
	best, bestScore, found := homeNode{}, uint64(0), false
	for _, n := range live {
		if until, down := h.down[n.run]; down {
			if now.Before(until) {
				continue
			}
			delete(h.down, n.run)
		}
		if s := homeScore(user, n.run); !found || s > bestScore {
			best, bestScore, found = n, s, true
		}
	}
	h.mu.Unlock()
	if !found || best.run == h.self {
		return homeNode{}, false
	}
	return best, true
}

// liveNodes returns the nodes that can be homes: this one and every other
// live lease with an address. One caller at a time reads them again once
// homeNodesTTL has passed; the others use the last list meanwhile.
func (h *homeRouter) liveNodes(ctx context.Context) []homeNode {
	h.mu.Lock()
	live, stale := h.live, h.readAt.IsZero() || h.now().Sub(h.readAt) >= homeNodesTTL
	if !stale || h.refreshing {
		h.mu.Unlock()
		return live
	}
	h.refreshing = true
	h.mu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err := h.readNodes(ctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.refreshing = false
	if err != nil {
		// Keep the last list; the next call after the TTL tries again.
		h.log.Warn("read live nodes for home routing", "err", err)
	}
	return h.live
}

// readNodes reads the node leases: it keeps the nodes that can be homes
// (h.live) and returns whether each run's lease is live. On an error the
// last list stays, read again after homeNodesTTL.
func (h *homeRouter) readNodes(ctx context.Context) (map[string]bool, error) {
	leases, err := h.nodes(ctx)
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.readAt = now
	if err != nil {
		return nil, err
	}
	live := make(map[string]bool, len(leases))
	var homes []homeNode
	self := false
	for _, l := range leases {
		live[l.Run] = l.Live
		switch {
		case l.Run == h.self:
			self = true
			homes = append(homes, homeNode{run: l.Run, addr: l.Addr})
		case l.Live && l.Addr != "":
			homes = append(homes, homeNode{run: l.Run, addr: l.Addr})
		}
	}
	if !self {
		// This node without its lease (not started, or lost): its users'
		// homes are unknown to it, so it serves every call itself.
		homes = nil
	}
	h.live = homes
	return live, nil
}

// homeScore is the rendezvous score of a node run for a user: the same on
// every node, with no two runs tied in practice.
func homeScore(user uuid.UUID, run string) uint64 {
	f := fnv.New64a()
	_, _ = f.Write(user[:])
	_, _ = f.Write([]byte(run))
	x := f.Sum64()
	// A finaliser (splitmix64's): FNV's last bytes barely reach its high
	// bits, and runs differ mostly at the end.
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
