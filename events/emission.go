package events

import (
	"encoding/json"
	"slices"
)

// Emission is one event bound for one room.
type Emission struct {
	Room  string
	Event Event
	// Offset names the emission in the delivery order every node of the
	// deployment shares (set by the bus when it delivers; empty when the
	// emission has no such name). Socket.IO connection state recovery sends
	// it to clients and replays what follows it.
	Offset string

	payload json.RawMessage // Event's JSON, kept by Set.Add
}

// Payload is the JSON object sent as the event's single argument.
func (e Emission) Payload() json.RawMessage {
	if e.payload != nil {
		return e.payload
	}
	if a, ok := e.Event.(jsonAppender); ok {
		return a.appendJSON(make([]byte, 0, 320))
	}
	b, err := json.Marshal(e.Event)
	if err != nil {
		// Every Event type is a plain struct of JSON-safe fields.
		panic("events: marshal " + e.Event.EventName() + ": " + err.Error())
	}
	return b
}

// Set collects the emissions of one transaction. Identical (room, event)
// pairs are kept once; distinct events are never merged; order of first
// insertion is preserved. The zero value is ready to use.
type Set struct {
	list []Emission
	seen map[string]struct{}
}

// Add records an event for a room unless the same pair is already in the set.
func (s *Set) Add(room string, ev Event) {
	em := Emission{Room: room, Event: ev}
	// The key needs the JSON; publishing reuses it. Clipped, so that a
	// reader appending to it copies instead of writing into shared bytes.
	em.payload = slices.Clip(em.Payload())
	key := room + "\x00" + ev.EventName() + "\x00" + string(em.payload)
	if s.seen == nil {
		s.seen = map[string]struct{}{}
	}
	if _, dup := s.seen[key]; dup {
		return
	}
	s.seen[key] = struct{}{}
	s.list = append(s.list, em)
}

// Merge adds every emission of o.
func (s *Set) Merge(o *Set) {
	for _, e := range o.list {
		s.Add(e.Room, e.Event)
	}
}

// List returns the emissions in insertion order.
func (s *Set) List() []Emission { return s.list }

// Len is the number of distinct emissions.
func (s *Set) Len() int { return len(s.list) }
