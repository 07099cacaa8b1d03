package joblib

import (
	"context"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/models"
)

// Group commit of status reports (PostgreSQL). The contract has every task
// reported one PATCH at a time (running, then completed), and each PATCH was
// one statement: its planning-free execution, its commit and its round trip
// were paid per report. A report that arrives while another report of the
// same user is in the database waits for it and goes out with every report
// that queued meanwhile, as one batch statement (models.UpdateTasksHot):
// under load the reports of many workers share a statement and a commit,
// and a report that finds nothing in flight goes out at once, alone. A
// batch holds reports of one user (the statement checks one owner) and of
// distinct tasks; each report gets the row its task changed, or none (the
// general path then answers it, as for a lone report).
//
// One caller leads at a time per user: it runs batches from the queue until
// its own report has been answered, then hands the lead to the oldest
// waiting caller, so no caller runs the statements of others for long.

// maxReportBatch is the most reports one group commit sends.
const maxReportBatch = 64

type reportBatcher struct {
	// run sends one batch of one user's reports.
	run func(ctx context.Context, user uuid.UUID, ups []models.HotUpdate) ([]models.HotTask, error)

	mu     sync.Mutex
	queues map[uuid.UUID]*reportQueue
}

// reportQueue is one user's reports waiting to be sent; busy is set while
// a caller leads.
type reportQueue struct {
	waiting []*reportCall
	busy    bool
}

type reportCall struct {
	ctx context.Context
	up  models.HotUpdate
	// wake receives false once the answer is set, true when this caller
	// is to lead.
	wake chan bool
	task *models.HotTask // the row the report changed; nil: none
	err  error
}

func newReportBatcher(run func(context.Context, uuid.UUID, []models.HotUpdate) ([]models.HotTask, error)) *reportBatcher {
	return &reportBatcher{run: run, queues: map[uuid.UUID]*reportQueue{}}
}

// report sends up, a report of one of user's workers, with whatever other
// reports of user are waiting, and returns the row it changed (nil when it
// changed nothing).
func (b *reportBatcher) report(ctx context.Context, user uuid.UUID, up models.HotUpdate) (*models.HotTask, error) {
	c := &reportCall{ctx: ctx, up: up, wake: make(chan bool, 1)}
	b.mu.Lock()
	q := b.queues[user]
	if q == nil {
		q = &reportQueue{}
		b.queues[user] = q
	}
	q.waiting = append(q.waiting, c)
	lead := !q.busy
	q.busy = true
	b.mu.Unlock()
	if !lead {
		lead = <-c.wake
	}
	if lead {
		b.lead(user, q, c)
	}
	return c.task, c.err
}

// lead sends batches of q until own is answered, then passes the lead on.
func (b *reportBatcher) lead(user uuid.UUID, q *reportQueue, own *reportCall) {
	for answered := false; !answered; {
		b.mu.Lock()
		batch := q.take()
		b.mu.Unlock()
		b.send(user, batch)
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
		delete(b.queues, user)
		b.mu.Unlock()
		return
	}
	next := q.waiting[0]
	b.mu.Unlock()
	next.wake <- true
}

// take removes from the queue up to maxReportBatch reports of distinct
// tasks, oldest first (a second report of a task waits for the next batch).
func (q *reportQueue) take() []*reportCall {
	var batch, rest []*reportCall
	seen := map[uuid.UUID]bool{}
	for _, c := range q.waiting {
		if len(batch) == maxReportBatch || seen[c.up.ID] {
			rest = append(rest, c)
			continue
		}
		seen[c.up.ID] = true
		batch = append(batch, c)
	}
	q.waiting = rest
	return batch
}

// send runs one batch and sets each report's answer. The statement runs
// under the latest deadline of its callers' contexts, and is not cancelled
// when one of them goes away: the others' reports are in it.
func (b *reportBatcher) send(user uuid.UUID, batch []*reportCall) {
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
	ups := make([]models.HotUpdate, len(batch))
	for i, c := range batch {
		ups[i] = c.up
	}
	hts, err := b.run(ctx, user, ups)
	byID := make(map[uuid.UUID]*models.HotTask, len(hts))
	for i := range hts {
		byID[hts[i].ID] = &hts[i]
	}
	for _, c := range batch {
		c.task, c.err = byID[c.up.ID], err
	}
}
