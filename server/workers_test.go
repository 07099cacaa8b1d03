package server_test

import (
	"testing"
	"time"
)

func TestWorkerLifecycle(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w := e.do(e.alice, "POST", api+"/workers", nil).want(201).M()
		id := w["id"].(string)
		if _, ok := w["last_heartbeat"].(string); !ok {
			t.Fatalf("no last_heartbeat in %v", w)
		}
		first := e.do(e.alice, "PATCH", api+"/workers/"+id, nil).want(200).M()["last_heartbeat"].(string)
		time.Sleep(10 * time.Millisecond)
		second := e.do(e.alice, "PATCH", api+"/workers/"+id, nil).want(200).M()["last_heartbeat"].(string)
		if !(second > first) {
			t.Fatalf("heartbeat did not advance: %s then %s", first, second)
		}
		// superusers are not exempt from heartbeat ownership
		e.do(e.admin, "PATCH", api+"/workers/"+id, nil).problem(403, "forbidden")
		e.do(e.bob, "DELETE", api+"/workers/"+id, nil).problem(403, "forbidden")
		e.do(e.alice, "DELETE", api+"/workers/"+id, nil).want(204)
		e.do(e.alice, "PATCH", api+"/workers/"+id, nil).problem(404, "worker-not-found")
		e.do(e.alice, "DELETE", api+"/workers/"+id, nil).problem(404, "worker-not-found")
		e.do(e.alice, "PATCH", api+"/workers/not-a-uuid", nil).problem(422, "validation-error")
	})
}
