package events

import (
	"encoding/json"
	"fmt"
)

// Decode rebuilds a typed Event from its wire name and JSON payload (events
// arriving from other nodes).
func Decode(name string, payload []byte) (Event, error) {
	var ev Event
	var err error
	switch name {
	case "jobs_invalidate":
		ev = JobsInvalidate{}
	case "providers_invalidate":
		ev = ProvidersInvalidate{}
	case "tasks_invalidate":
		ev = TasksInvalidate{}
	case "task_available":
		ev, err = decodeAs[TaskAvailable](payload)
	case "task_status_event":
		if e, ok := decodeStatusEvent(payload); ok {
			return e, nil
		}
		ev, err = decodeAs[TaskStatusEvent](payload)
	case "task_cancelled":
		ev, err = decodeAs[TaskCancelled](payload)
	case "task_progress_event":
		ev, err = decodeAs[TaskProgressEvent](payload)
	case "provider_request":
		ev, err = decodeAs[ProviderRequest](payload)
	case "provider_result_ready":
		ev, err = decodeAs[ProviderResultReady](payload)
	default:
		return nil, fmt.Errorf("decode event: unknown name %q", name)
	}
	if err != nil {
		return nil, fmt.Errorf("decode %s: %w", name, err)
	}
	return ev, nil
}

// decodeAs unmarshals a payload into the event type T.
func decodeAs[T Event](payload []byte) (Event, error) {
	var v T
	err := json.Unmarshal(payload, &v)
	return v, err
}
