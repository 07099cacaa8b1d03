package joblib

import (
	"context"
	"slices"

	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/models"
)

// hotNotify tells the hot statements how to write task status events for
// other nodes to the event outbox (zero: this bus has no other nodes).
func (s *Service) hotNotify() models.HotNotify {
	tb := s.txBus()
	if tb == nil {
		return models.HotNotify{}
	}
	f := tb.Frame(events.TaskStatusEvent{}.EventName())
	return models.HotNotify{
		Channel: f.Channel, Head: f.Head, Open: f.Open, Middle: f.Middle, Close: f.Close, Tail: f.Tail,
		RoomPrefix: events.Room(""), MaxBytes: events.MaxNotifyBytes, ID: f.ID,
	}
}

// publishHot publishes the status events of tasks a hot statement changed,
// which has committed: this node's subscribers get them now; for other
// nodes the statement wrote them to the outbox, and the relay is woken;
// events too large for a NOTIFY are sent now.
func (s *Service) publishHot(ctx context.Context, hts []models.HotTask) []Task {
	out := make([]Task, len(hts))
	ems := make([]events.Emission, len(hts))
	var late []events.Emission
	for i, ht := range hts {
		out[i] = taskView(ht.Task)
		ems[i] = events.Emission{Room: events.Room(out[i].RoomID), Event: statusEvent(out[i])}
		if !ht.Notified {
			late = append(late, ems[i])
		}
	}
	tb := s.txBus()
	if tb == nil {
		s.publish(ctx, ems)
		return out
	}
	tb.Deliver(ems)
	if len(late) < len(ems) {
		var frames []uint64
		for _, ht := range hts {
			if ht.Notified && !slices.Contains(frames, ht.Frame) {
				frames = append(frames, ht.Frame)
			}
		}
		s.relay.pokeFrames(frames...)
	}
	if len(late) > 0 {
		s.notifyLate(ctx, tb, late)
	}
	return out
}

// notifyLate sends to other nodes, after the commit, events a hot statement
// could not send inline (too large for its NOTIFY).
func (s *Service) notifyLate(ctx context.Context, tb events.TxBus, ems []events.Emission) {
	ctx = context.WithoutCancel(ctx)
	msg, err := tb.Notification(ctx, ems)
	if err == nil {
		err = s.db.NotifyNow(ctx, tb.Channel(), msg)
	}
	if err != nil {
		s.log.Error("publish events", "count", len(ems), "err", err)
	}
}
