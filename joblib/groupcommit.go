package joblib

import (
	"context"
	"sync"
	"time"

	"github.com/google/uuid"
)

// Group commit (PostgreSQL). A worker's everyday call (a status report, a
// claim) is one statement, whose execution start-up, commit and round trip
// are paid per call. A call that arrives while another call of the same key
// (reports; claims of the same claim mode; of any user) is in the database
// waits for it and goes out with every call that queued meanwhile, as one
// statement: under load the calls of many workers share a statement and a
// commit, and a call that finds nothing in flight goes out at once, alone.
//
// One caller leads at a time per key: it runs batches from the queue until
// its own call has been answered, then hands the lead to the oldest waiting
// caller, so no caller runs the statements of others for long.
//
// Waiting only behind a statement in flight groups little while the database
// is fast: most calls of a busy fleet find none and go alone, each paying
// the fixed cost again. So a call that would go alone first waits the delay
// (as PostgreSQL's commit_delay does for commits) and takes along the calls
// that arrived meanwhile, but only while its key is busy: when one of the
// key's batches in the last sharedWindow carried more than one call. The
// calls of a node with one busy worker come one after the other and never
// share a batch, so they never wait; nor do those of a key that has gone
// quiet.

// groupCommit batches calls of type R, answered with A, per key K.
type groupCommit[K comparable, R, A any] struct {
	// run sends one batch of one key's calls and returns an answer per call,
	// in order.
	run func(ctx context.Context, key K, batch []R) ([]A, error)
	// id names the row a call changes: a batch holds at most one call per
	// id (a second one waits for the next batch).
	id  func(R) uuid.UUID
	max int // the most calls one batch sends
	// delay is how long a call that would go alone waits for company
	// while its key is busy (0: never); sleep waits it (preciseSleep).
	delay func() time.Duration
	sleep func(time.Duration)

	mu     sync.Mutex
	queues map[K]*groupQueue[R, A]
	// shared is when each key last sent a batch of more than one call.
	shared map[K]time.Time
}

// sharedWindow is how recent a key's last shared batch must be for its
// lone calls to wait for company.
const sharedWindow = 10 * time.Millisecond

// maxShared bounds the keys shared remembers: past it the entries older
// than sharedWindow are dropped.
const maxShared = 4096

// groupQueue is one key's calls waiting to be sent; busy is set while a
// caller leads.
type groupQueue[R, A any] struct {
	waiting []*groupCall[R, A]
	busy    bool
}

type groupCall[R, A any] struct {
	ctx context.Context
	req R
	// wake receives false once the answer is set, true when this caller
	// is to lead.
	wake chan bool
	ans  A
	err  error
}

// newGroupCommit batches calls with run; delay, nil or returning 0, makes
// lone calls go at once.
func newGroupCommit[K comparable, R, A any](max int, id func(R) uuid.UUID, delay func() time.Duration, run func(context.Context, K, []R) ([]A, error)) *groupCommit[K, R, A] {
	if delay == nil {
		delay = func() time.Duration { return 0 }
	}
	return &groupCommit[K, R, A]{run: run, id: id, max: max, delay: delay, sleep: preciseSleep, queues: map[K]*groupQueue[R, A]{}, shared: map[K]time.Time{}}
}

// call sends req with whatever other calls of key are waiting, and returns
// its answer.
func (b *groupCommit[K, R, A]) call(ctx context.Context, key K, req R) (A, error) {
	c := &groupCall[R, A]{ctx: ctx, req: req, wake: make(chan bool, 1)}
	b.mu.Lock()
	q := b.queues[key]
	if q == nil {
		q = &groupQueue[R, A]{}
		b.queues[key] = q
	}
	q.waiting = append(q.waiting, c)
	lead := !q.busy
	q.busy = true
	b.mu.Unlock()
	if !lead {
		lead = <-c.wake
	}
	if lead {
		b.lead(key, q, c)
	}
	return c.ans, c.err
}

// lead sends batches of q until own is answered, then passes the lead on.
func (b *groupCommit[K, R, A]) lead(key K, q *groupQueue[R, A], own *groupCall[R, A]) {
	b.awaitCompany(key, q)
	for answered := false; !answered; {
		b.mu.Lock()
		batch := b.take(q)
		if len(batch) > 1 {
			b.markShared(key)
		}
		b.mu.Unlock()
		b.send(key, batch)
		for _, c := range batch {
			if c == own {
				answered = true
			} else {
				c.wake <- false
			}
		}
	}
	b.mu.Lock()
	if len(q.waiting) == 0 {
		q.busy = false
		delete(b.queues, key)
		b.mu.Unlock()
		return
	}
	next := q.waiting[0]
	b.mu.Unlock()
	next.wake <- true
}

// awaitCompany waits the delay when the leader's call is alone in q and key
// is busy; the calls that arrive meanwhile go in its batch.
func (b *groupCommit[K, R, A]) awaitCompany(key K, q *groupQueue[R, A]) {
	d := b.delay()
	if d <= 0 {
		return
	}
	b.mu.Lock()
	last, ok := b.shared[key]
	busy := ok && time.Since(last) < sharedWindow
	alone := len(q.waiting) == 1
	b.mu.Unlock()
	if alone && busy {
		b.sleep(d)
	}
}

// markShared notes that key sent a batch of more than one call (b.mu held).
func (b *groupCommit[K, R, A]) markShared(key K) {
	now := time.Now()
	if _, ok := b.shared[key]; !ok && len(b.shared) >= maxShared {
		for k, t := range b.shared {
			if now.Sub(t) >= sharedWindow {
				delete(b.shared, k)
			}
		}
	}
	b.shared[key] = now
}

// take removes from the queue up to max calls of distinct ids, oldest
// first.
func (b *groupCommit[K, R, A]) take(q *groupQueue[R, A]) []*groupCall[R, A] {
	var batch, rest []*groupCall[R, A]
	seen := map[uuid.UUID]bool{}
	for _, c := range q.waiting {
		id := b.id(c.req)
		if len(batch) == b.max || seen[id] {
			rest = append(rest, c)
			continue
		}
		seen[id] = true
		batch = append(batch, c)
	}
	q.waiting = rest
	return batch
}

// send runs one batch and sets each call's answer. The statement runs under
// the latest deadline of its callers' contexts, and is not cancelled when
// one of them goes away: the others' calls are in it.
func (b *groupCommit[K, R, A]) send(key K, batch []*groupCall[R, A]) {
	ctx := context.WithoutCancel(batch[0].ctx)
	var latest time.Time
	bounded := true
	for _, c := range batch {
		d, ok := c.ctx.Deadline()
		if !ok {
			bounded = false
			break
		}
		if d.After(latest) {
			latest = d
		}
	}
	if bounded {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, latest)
		defer cancel()
	}
	reqs := make([]R, len(batch))
	for i, c := range batch {
		reqs[i] = c.req
	}
	ans, err := b.run(ctx, key, reqs)
	for i, c := range batch {
		c.err = err
		if err == nil && i < len(ans) {
			c.ans = ans[i]
		}
	}
}
