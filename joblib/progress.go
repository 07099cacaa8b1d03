package joblib

import (
	"context"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/models"
)

// MaxProgressMessage bounds a progress message in bytes; a longer one is
// cut at a character boundary (a progress report is never refused for it).
const MaxProgressMessage = 1024

// ReportProgress records the progress of a task held by one of the caller's
// workers and moves its deadline (heartbeat_timeout counts again from now,
// by the database's clock). The task's room gets task_progress_event,
// coalesced per task to at most Settings.TaskProgressRate per second,
// always with the latest value; the last progress before the task's
// terminal status event is published before it. Only the owner of the
// holding worker may report (403); a task not claimed or running, or past
// its deadline, answers 409. It returns the task as it is now.
func (s *Service) ReportProgress(ctx context.Context, p Principal, id uuid.UUID, pr Progress) (Task, error) {
	if pr.Message != nil && len(*pr.Message) > MaxProgressMessage {
		m := *pr.Message
		cut := MaxProgressMessage
		for cut > 0 && !utf8.RuneStart(m[cut]) {
			cut--
		}
		m = m[:cut]
		pr.Message = &m
	}
	t, ok, err := s.db.Q(ctx).ReportProgress(id, p.ID, models.Progress{Current: pr.Current, Total: pr.Total, Message: pr.Message})
	if err != nil {
		return Task{}, err
	}
	if !ok {
		return Task{}, s.progressRefused(ctx, p, id)
	}
	v := taskView(t)
	s.progress.report(events.TaskProgressEvent{
		ID: v.ID.String(), RoomID: v.RoomID, JobName: v.JobName,
		Current: pr.Current, Total: pr.Total, Message: pr.Message, ProgressAt: v.ProgressAt,
	})
	return v, nil
}

// progressRefused tells why a progress report changed nothing.
func (s *Service) progressRefused(ctx context.Context, p Principal, id uuid.UUID) error {
	q := s.db.Q(ctx)
	t, err := q.GetTask(id)
	if err != nil {
		return notFound(err, errf(CodeTaskNotFound, "Task '%s' not found", id))
	}
	if t.Status != models.StatusClaimed && t.Status != models.StatusRunning {
		return errf(CodeInvalidTaskTransition, "Cannot report progress on a task in status '%s'", t.Status)
	}
	if t.WorkerID != nil {
		w, err := q.GetWorker(*t.WorkerID)
		if err != nil && !isNotFound(err) {
			return err
		}
		if err != nil || w.UserID != p.ID {
			return errf(CodeForbidden, "Only the owner of the worker holding the task may report its progress")
		}
	}
	if overdue, err := q.TaskOverdue(id); err != nil || overdue {
		if err != nil {
			return err
		}
		return errf(CodeInvalidTaskTransition, "Cannot report progress: the task is past its deadline and is being timed out")
	}
	return errf(CodeInvalidTaskTransition, "Cannot report progress on this task")
}

// progressCoalescer publishes task_progress_event at most rate times per
// second per task, always the latest value: the first report of a quiet
// task goes out at once, later ones wait for the task's next slot and
// replace each other meanwhile. A task's entry lives until one interval
// after its last publication, so the map holds only tasks reporting now.
type progressCoalescer struct {
	publish func([]events.Emission)
	rate    func() float64

	mu    sync.Mutex
	tasks map[string]*progressEntry
}

type progressEntry struct {
	pending *events.TaskProgressEvent
	timer   *time.Timer
}

func newProgressCoalescer(publish func([]events.Emission), rate func() float64) *progressCoalescer {
	return &progressCoalescer{publish: publish, rate: rate, tasks: map[string]*progressEntry{}}
}

func (c *progressCoalescer) interval() time.Duration {
	r := c.rate()
	if r <= 0 {
		return 0
	}
	return time.Duration(float64(time.Second) / r)
}

func progressEmission(ev events.TaskProgressEvent) events.Emission {
	return events.Emission{Room: events.Room(ev.RoomID), Event: ev}
}

// report publishes ev now or as the task's pending value.
func (c *progressCoalescer) report(ev events.TaskProgressEvent) {
	every := c.interval()
	c.mu.Lock()
	if e := c.tasks[ev.ID]; e != nil {
		e.pending = &ev
		c.mu.Unlock()
		return
	}
	if every > 0 {
		e := &progressEntry{}
		e.timer = time.AfterFunc(every, func() { c.tick(ev.ID, e) })
		c.tasks[ev.ID] = e
	}
	c.mu.Unlock()
	c.publish([]events.Emission{progressEmission(ev)})
}

// tick ends a task's interval: its pending value goes out and starts the
// next one, or the task is forgotten.
func (c *progressCoalescer) tick(id string, e *progressEntry) {
	c.mu.Lock()
	if c.tasks[id] != e {
		c.mu.Unlock()
		return
	}
	ev := e.pending
	e.pending = nil
	if ev == nil {
		delete(c.tasks, id)
		c.mu.Unlock()
		return
	}
	e.timer.Reset(c.interval())
	c.mu.Unlock()
	c.publish([]events.Emission{progressEmission(*ev)})
}

// take removes and returns the pending progress of tasks about to end, for
// the caller to publish before their terminal status events.
func (c *progressCoalescer) take(ids ...uuid.UUID) []events.Emission {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []events.Emission
	for _, id := range ids {
		k := id.String()
		e := c.tasks[k]
		if e == nil {
			continue
		}
		e.timer.Stop()
		delete(c.tasks, k)
		if e.pending != nil {
			out = append(out, progressEmission(*e.pending))
		}
	}
	return out
}

// flush publishes now the pending progress of tasks about to end.
func (c *progressCoalescer) flush(ids ...uuid.UUID) {
	if ems := c.take(ids...); len(ems) > 0 {
		c.publish(ems)
	}
}

// publishNow publishes emissions that no transaction carries (coalesced
// progress): on a PostgreSQL bus through the event outbox, as a committed
// change's events go, so that every node delivers them in the same order.
func (s *Service) publishNow(ems []events.Emission) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tb := s.txBus()
	if tb == nil {
		s.publish(ctx, ems)
		return
	}
	msg, err := tb.Notification(ctx, ems)
	if err == nil {
		err = s.db.Q(ctx).WriteOutbox(msg)
	}
	if err != nil {
		s.log.Error("publish progress events", "count", len(ems), "err", err)
		return
	}
	tb.Deliver(ems)
	s.relay.poke()
}
