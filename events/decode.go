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
		var v TaskAvailable
		err = json.Unmarshal(payload, &v)
		ev = v
	case "task_status_event":
		var v TaskStatusEvent
		err = json.Unmarshal(payload, &v)
		ev = v
	case "task_cancelled":
		var v TaskCancelled
		err = json.Unmarshal(payload, &v)
		ev = v
	case "task_progress_event":
		var v TaskProgressEvent
		err = json.Unmarshal(payload, &v)
		ev = v
	case "provider_request":
		var v ProviderRequest
		err = json.Unmarshal(payload, &v)
		ev = v
	case "provider_result_ready":
		var v ProviderResultReady
		err = json.Unmarshal(payload, &v)
		ev = v
	default:
		return nil, fmt.Errorf("decode event: unknown name %q", name)
	}
	if err != nil {
		return nil, fmt.Errorf("decode %s: %w", name, err)
	}
	return ev, nil
}
