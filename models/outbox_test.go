package models_test

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// wireFrame is a HotNotify in the wire batch's own form (events.PGBus.Frame),
// so that the outbox rows parse as JSON.
func wireFrame(maxBytes int) models.HotNotify {
	return models.HotNotify{Channel: "joblib", Head: `{"i":9,"e":[`, Open: `{"r":`, Middle: `,"t":"task_status_event","p":`, Close: `}`, Tail: `]}`,
		RoomPrefix: "room:", MaxBytes: maxBytes, ID: 9}
}

// outboxRow is one outbox row: its payload's items, in order.
type outboxRow []struct {
	Room string `json:"r"`
	Name string `json:"t"`
	P    struct {
		ID     uuid.UUID `json:"id"`
		Status string    `json:"status"`
		TaskID uuid.UUID `json:"task_id"` // task_available
	} `json:"p"`
}

// takeOutbox returns the outbox rows in id order (the relay's) and empties
// the outbox, with each payload's length.
func takeOutbox(t *testing.T, db *models.DB) (rows []outboxRow, sizes []int) {
	t.Helper()
	rs, err := db.Pool.Query(context.Background(), "DELETE FROM joblib_event_outbox RETURNING id, payload")
	if err != nil {
		t.Fatal(err)
	}
	type raw struct {
		id      int64
		payload string
	}
	var got []raw
	for rs.Next() {
		var r raw
		if err := rs.Scan(&r.id, &r.payload); err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, func(a, b raw) int { return cmp.Compare(a.id, b.id) }) // DELETE … RETURNING has no order
	for _, r := range got {
		var b struct {
			ID    uint64    `json:"i"`
			Items outboxRow `json:"e"`
		}
		if err := json.Unmarshal([]byte(r.payload), &b); err != nil {
			t.Fatalf("outbox row %q: %v", r.payload, err)
		}
		if b.ID != 9 {
			t.Errorf("outbox row under frame %d, want 9", b.ID)
		}
		rows, sizes = append(rows, b.Items), append(sizes, len(r.payload))
	}
	return rows, sizes
}

// A hot statement writes the events of all the tasks it changes as one
// outbox row, in seq order, while they fit in one payload; past that, one
// row per event, still in seq order; an event too large alone is not
// written, and its task comes back not notified, for the caller to send.
func TestHotStatementWritesItsEventsAsOneRowWhileTheyFit(t *testing.T) {
	t.Parallel()
	db := dbtest.Open(t, models.Postgres)
	f := newFixture(t, db)
	j := f.job("Outbox", "fail", 1)
	w := f.worker(j)
	var ids []uuid.UUID
	for range 9 {
		ids = append(ids, f.task(j))
	}
	ctx := context.Background()
	_, hts, err := db.ClaimTasksHot(ctx, w, f.user, 9, false, wireFrame(7900))
	f.must(err)
	if len(hts) != 9 {
		t.Fatalf("claimed %d tasks, want 9", len(hts))
	}
	rows, sizes := takeOutbox(t, db)
	if len(rows) != 1 || len(rows[0]) != 9 {
		t.Fatalf("claim of 9 wrote %d rows (%v), want one of 9 events", len(rows), rows)
	}
	for k, it := range rows[0] {
		if it.P.ID != ids[k] || it.P.Status != models.StatusClaimed || it.Room != "room:r" || it.Name != "task_status_event" || !hts[k].Notified || hts[k].Frame != 9 {
			t.Errorf("event %d: %+v (notified %v), want task %v claimed in room:r", k, it, hts[k].Notified, ids[k])
		}
	}
	// Running, the nine events are longer than claimed (they carry
	// started_at): with the claim's payload length as the limit they do
	// not fit in one payload, and go one row each, in seq order.
	ups := func(status string) []models.HotUpdate {
		var u []models.HotUpdate
		for _, id := range ids {
			u = append(u, models.HotUpdate{ID: id, User: f.user, Status: status})
		}
		return u
	}
	hts, err = db.UpdateTasksHot(ctx, ups(models.StatusRunning), []string{"claimed>running"}, wireFrame(sizes[0]))
	f.must(err)
	if len(hts) != 9 {
		t.Fatalf("updated %d tasks, want 9", len(hts))
	}
	rows, _ = takeOutbox(t, db)
	if len(rows) != 9 {
		t.Fatalf("a batch whose events do not fit in one payload wrote %d rows, want 9", len(rows))
	}
	for k, r := range rows {
		if len(r) != 1 || r[0].P.ID != ids[k] || r[0].P.Status != models.StatusRunning || !hts[k].Notified {
			t.Errorf("row %d: %+v, want task %v running alone", k, r, ids[k])
		}
	}
	// A limit no event fits in writes nothing, and says so.
	hts, err = db.UpdateTasksHot(ctx, ups(models.StatusCompleted), []string{"running>completed"}, wireFrame(40))
	f.must(err)
	if len(hts) != 9 {
		t.Fatalf("completed %d tasks, want 9", len(hts))
	}
	if rows, _ = takeOutbox(t, db); len(rows) != 0 {
		t.Errorf("events too large for a payload were written: %v", rows)
	}
	for _, ht := range hts {
		if ht.Notified {
			t.Errorf("task %v notified, but its event was too large", ht.ID)
		}
	}
}

// A submission writes its status event and task_available as one row, the
// status event first, or, when the two do not fit together, neither.
func TestSubmitWritesBothEventsAsOneRow(t *testing.T) {
	t.Parallel()
	db := dbtest.Open(t, models.Postgres)
	f := newFixture(t, db)
	j := f.job("OutboxSubmit", "fail", 1)
	ctx := context.Background()
	av := models.AvailableFrame{Middle: `,"t":"task_available","p":`, JobRoomPrefix: "jobs:"}
	id := uuid.New()
	ht, ok, err := db.SubmitTaskHot(ctx, id, j.RoomID, j.Category, j.Name, "r", f.user, "{}", nil, 0, wireFrame(7900), av)
	f.must(err)
	if !ok || !ht.Notified || ht.Frame != 9 {
		t.Fatalf("submit: ok %v notified %v frame %d", ok, ht.Notified, ht.Frame)
	}
	rows, sizes := takeOutbox(t, db)
	if len(rows) != 1 || len(rows[0]) != 2 {
		t.Fatalf("submit wrote %v, want one row of two events", rows)
	}
	if s, a := rows[0][0], rows[0][1]; s.Name != "task_status_event" || s.P.ID != id || s.P.Status != models.StatusPending || s.Room != "room:r" ||
		a.Name != "task_available" || a.P.TaskID != id || a.Room != "jobs:r:modifiers:OutboxSubmit" {
		t.Errorf("submit's events: %+v", rows[0])
	}
	// A limit below the two together but above either alone (the
	// timestamps' fractions may be up to 7 bytes shorter).
	ht, ok, err = db.SubmitTaskHot(ctx, uuid.New(), j.RoomID, j.Category, j.Name, "r", f.user, "{}", nil, 0, wireFrame(sizes[0]-8), av)
	f.must(err)
	if !ok || ht.Notified {
		t.Errorf("submit past the limit: ok %v notified %v, want ok and not notified", ok, ht.Notified)
	}
	if rows, _ = takeOutbox(t, db); len(rows) != 0 {
		t.Errorf("submit past the limit wrote %v", rows)
	}
}
