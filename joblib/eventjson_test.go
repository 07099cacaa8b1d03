package joblib_test

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// TestEventJSONFromSQLMatchesGo: on PostgreSQL the one-statement paths
// (submit, claim, status reports) build their events' JSON in SQL, while
// every other path marshals the events package's structs. Other nodes, and
// so their sockets, get whichever one the path built. For every event kind
// the SQL builds, and for each state a task passes through, the SQL object
// must have the Go object's keys, each value of the same JSON type, and the
// same values once decoded (timestamps to the microsecond).
func TestEventJSONFromSQLMatchesGo(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := dbtest.Open(t, models.Postgres)
	bus := events.NewPGBus(db.Pool, "eventjson", nil)
	if err := bus.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bus.Stop)
	svc := joblib.New(joblib.Config{DB: db, Bus: bus})
	t.Cleanup(svc.Close)
	sql := listenSQLBuilt(t, db.Pool, bus.Channel())

	_, alice, err := svc.CreateToken(ctx, "alice", false)
	if err != nil {
		t.Fatal(err)
	}
	w, err := svc.CreateWorker(ctx, alice)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := svc.RegisterJob(ctx, alice, "r", joblib.RegisterJobParams{Category: "modifiers", Name: "j", WorkerID: &w.ID}); err != nil {
		t.Fatal(err)
	}
	checkStatus := func(step string, task joblib.Task) {
		t.Helper()
		goJSON, err := json.Marshal(joblib.StatusEvent(task))
		if err != nil {
			t.Fatal(err)
		}
		sameEventJSON(t, step, "task_status_event", sql.next(t, step, "task_status_event", task.ID.String()), goJSON)
	}
	kinds := map[string]bool{}
	for _, end := range []string{"completed", "failed"} {
		task, err := svc.SubmitTask(ctx, alice, "r", "r:modifiers:j", json.RawMessage(`{"x":1}`))
		if err != nil {
			t.Fatal(err)
		}
		checkStatus(end+": submit", task)
		goAvail, _ := json.Marshal(events.TaskAvailable{JobName: task.JobName, RoomID: task.RoomID, TaskID: task.ID.String()})
		sameEventJSON(t, end+": submit", "task_available", sql.next(t, end+": submit", "task_available", task.ID.String()), goAvail)
		claimed, err := svc.ClaimTasks(ctx, alice, w.ID, 1, false)
		if err != nil || len(claimed) != 1 || claimed[0].ID != task.ID {
			t.Fatalf("claim: %v %v", claimed, err)
		}
		checkStatus(end+": claim", claimed[0])
		if end == "completed" {
			running, err := svc.UpdateTask(ctx, alice, task.ID, "running", nil)
			if err != nil {
				t.Fatal(err)
			}
			checkStatus(end+": running", running)
			done, err := svc.UpdateTask(ctx, alice, task.ID, "completed", nil)
			if err != nil {
				t.Fatal(err)
			}
			checkStatus(end+": completed", done)
		} else {
			msg := "boom: \"quoted\" \u00e9"
			failed, err := svc.UpdateTask(ctx, alice, task.ID, "failed", &msg)
			if err != nil {
				t.Fatal(err)
			}
			checkStatus(end+": failed", failed)
		}
		kinds["task_status_event"], kinds["task_available"] = true, true
	}
	if got := slices.Sorted(maps.Keys(sql.kinds())); !slices.Equal(got, slices.Sorted(maps.Keys(kinds))) {
		t.Fatalf("SQL built events of kinds %v, the test checks %v: check every kind", got, slices.Sorted(maps.Keys(kinds)))
	}
}

// sameEventJSON compares an event object built in SQL with the one Go
// marshals for the same state.
func sameEventJSON(t *testing.T, step, kind string, sqlJSON, goJSON []byte) {
	t.Helper()
	var s, g map[string]json.RawMessage
	if err := json.Unmarshal(sqlJSON, &s); err != nil {
		t.Fatalf("%s: %s from SQL is not an object: %v\n%s", step, kind, err, sqlJSON)
	}
	if err := json.Unmarshal(goJSON, &g); err != nil {
		t.Fatal(err)
	}
	if sk, gk := slices.Sorted(maps.Keys(s)), slices.Sorted(maps.Keys(g)); !slices.Equal(sk, gk) {
		t.Fatalf("%s: %s keys differ\nSQL %v\nGo  %v", step, kind, sk, gk)
	}
	for k, gv := range g {
		if jsonType(s[k]) != jsonType(gv) {
			t.Errorf("%s: %s.%s is a %s in SQL (%s), a %s in Go (%s)", step, kind, k, jsonType(s[k]), s[k], jsonType(gv), gv)
		}
	}
	// Values: the SQL object decoded as a receiving node decodes it, and
	// marshalled again, is byte for byte the Go object.
	ev, err := events.Decode(kind, sqlJSON)
	if err != nil {
		t.Fatalf("%s: decode %s from SQL: %v\n%s", step, kind, err, sqlJSON)
	}
	again, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, goJSON) {
		t.Errorf("%s: %s values differ\nSQL %s\n  → %s\nGo  %s", step, kind, sqlJSON, again, goJSON)
	}
}

func jsonType(v json.RawMessage) string {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return "missing"
	}
	switch v[0] {
	case 'n':
		return "null"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case '{':
		return "object"
	case '[':
		return "array"
	}
	return "number"
}

// sqlBuilt collects the event objects of the batches a SQL statement built
// (those named by a statement id, "i"; Go-built batches carry "s").
type sqlBuilt struct {
	ch   chan sqlEvent
	seen map[string]bool
}

type sqlEvent struct {
	kind, id string
	payload  json.RawMessage
}

func listenSQLBuilt(t *testing.T, pool *pgxpool.Pool, channel string) *sqlBuilt {
	t.Helper()
	ctx := t.Context()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	s := &sqlBuilt{ch: make(chan sqlEvent, 64), seen: map[string]bool{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			n, err := conn.Conn().WaitForNotification(ctx)
			if err != nil {
				return
			}
			var b struct {
				ID    uint64 `json:"i"`
				Items []struct {
					Name    string          `json:"t"`
					Payload json.RawMessage `json:"p"`
				} `json:"e"`
			}
			if json.Unmarshal([]byte(n.Payload), &b) != nil || b.ID == 0 {
				continue
			}
			for _, it := range b.Items {
				var id struct {
					ID     string `json:"id"`
					TaskID string `json:"task_id"`
				}
				_ = json.Unmarshal(it.Payload, &id)
				s.ch <- sqlEvent{kind: it.Name, id: id.ID + id.TaskID, payload: it.Payload}
			}
		}
	}()
	t.Cleanup(func() {
		<-done // ctx (the test's) ends first
		conn.Release()
	})
	return s
}

// next waits for the SQL-built event of kind about the task.
func (s *sqlBuilt) next(t *testing.T, step, kind, id string) []byte {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case e := <-s.ch:
			s.seen[e.kind] = true
			if e.kind == kind && e.id == id {
				return e.payload
			}
		case <-deadline:
			t.Fatalf("%s: no SQL-built %s for task %s: did the one-statement path run?", step, kind, id)
		}
	}
}

func (s *sqlBuilt) kinds() map[string]bool { return s.seen }
