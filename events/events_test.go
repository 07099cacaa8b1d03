package events_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zndraw/joblib/events"
)

func payload(t *testing.T, ev events.Event) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(events.Emission{Room: "r", Event: ev}.Payload(), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func keys(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// Contract §5.2: every server→client event's wire name and the exact field
// set of its single-object payload, with null fields present.
func TestWireNamesAndPayloadFields(t *testing.T) {
	t.Parallel()
	cases := []struct {
		ev     events.Event
		name   string
		fields []string
	}{
		{events.JobsInvalidate{}, "jobs_invalidate", nil},
		{events.TaskAvailable{}, "task_available", []string{"job_name", "room_id", "task_id"}},
		{events.TaskStatusEvent{}, "task_status_event", []string{"completed_at", "created_at", "error", "id", "name", "queue_position", "room_id", "started_at", "status", "worker_id"}},
		{events.ProvidersInvalidate{}, "providers_invalidate", nil},
		{events.ProviderRequest{}, "provider_request", []string{"params", "provider_name", "request_id"}},
		{events.ProviderResultReady{}, "provider_result_ready", []string{"provider_name", "request_hash"}},
	}
	for _, c := range cases {
		if got := c.ev.EventName(); got != c.name {
			t.Errorf("%T wire name %q, want %q", c.ev, got, c.name)
		}
		if got := keys(payload(t, c.ev)); !slices.Equal(got, c.fields) {
			t.Errorf("%s payload fields %v, want %v", c.name, got, c.fields)
		}
	}
	// Empty events are the object {}, not null.
	if p := string(events.Emission{Event: events.JobsInvalidate{}}.Payload()); p != "{}" {
		t.Errorf("jobs_invalidate payload %s, want {}", p)
	}
}

// A task_status_event carries nulls for unset fields and RFC 3339 UTC
// timestamps ending in Z (converted from any zone).
func TestTaskStatusEventValues(t *testing.T) {
	t.Parallel()
	cet := time.FixedZone("CET", 3600)
	pos := int64(2)
	m := payload(t, events.TaskStatusEvent{
		ID: "t", Name: "@global:modifiers:Rotate", RoomID: "room", Status: "pending",
		CreatedAt:     events.Time{Time: time.Date(2026, 3, 1, 13, 4, 5, 123456000, cet)},
		QueuePosition: &pos,
	})
	if m["created_at"] != "2026-03-01T12:04:05.123456Z" {
		t.Errorf("created_at %v", m["created_at"])
	}
	for _, k := range []string{"started_at", "completed_at", "worker_id", "error"} {
		if v, ok := m[k]; !ok || v != nil {
			t.Errorf("%s = %v (present %v), want null", k, v, ok)
		}
	}
	if m["queue_position"] != 2.0 || m["status"] != "pending" {
		t.Errorf("payload %v", m)
	}
	var back events.Time
	if err := json.Unmarshal([]byte(`"2026-03-01T12:04:05.123456Z"`), &back); err != nil || !back.Equal(time.Date(2026, 3, 1, 12, 4, 5, 123456000, time.UTC)) {
		t.Errorf("round trip %v %v", back, err)
	}
}

// Contract §5.4 (test_events.py): identical (event, room) pairs are sent once,
// the same event to another room is kept, distinct events are never merged.
func TestSetDeduplicates(t *testing.T) {
	t.Parallel()
	var s events.Set
	s.Add(events.Room("@global"), events.JobsInvalidate{})
	s.Add(events.Room("@global"), events.JobsInvalidate{})
	s.Add(events.Room("test"), events.JobsInvalidate{})
	if s.Len() != 2 {
		t.Fatalf("jobs_invalidate ×2 + other room: %d emissions, want 2", s.Len())
	}
	s.Add(events.Room("test"), events.TaskStatusEvent{ID: "a", Status: "pending"})
	s.Add(events.Room("test"), events.TaskStatusEvent{ID: "b", Status: "pending"})
	s.Add(events.Room("test"), events.TaskStatusEvent{ID: "a", Status: "claimed"})
	s.Add(events.Room("test"), events.TaskStatusEvent{ID: "a", Status: "pending"})
	if s.Len() != 5 {
		t.Fatalf("distinct task events merged: %d emissions, want 5", s.Len())
	}
	var o events.Set
	o.Add(events.Room("@global"), events.JobsInvalidate{})
	o.Add(events.JobRoom("@global:modifiers:Rotate"), events.TaskAvailable{JobName: "@global:modifiers:Rotate", RoomID: "r", TaskID: "a"})
	s.Merge(&o)
	if s.Len() != 6 {
		t.Fatalf("merge: %d emissions, want 6", s.Len())
	}
	if l := s.List(); l[0].Room != "room:@global" || l[5].Room != "jobs:@global:modifiers:Rotate" {
		t.Fatalf("insertion order lost: %v", l)
	}
}

// Room names of §5.2.
func TestRoomNames(t *testing.T) {
	t.Parallel()
	got := strings.Join([]string{events.Room("r1"), events.JobRoom("@global:modifiers:Rotate"), events.ProviderRoom("@global:filesystem:local")}, " ")
	if want := "room:r1 jobs:@global:modifiers:Rotate providers:@global:filesystem:local"; got != want {
		t.Fatalf("rooms %q, want %q", got, want)
	}
}
