package models_test

import (
	"context"
	"testing"
	"time"

	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// TestSocketSessions: a kept session is taken once, only before it expires
// by the database clock, and the purge deletes exactly the expired ones.
func TestSocketSessions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.Open(t, models.Postgres)
	live := models.SocketSession{PID: "p-live", SID: "s1", Rooms: `["room:a"]`, Owner: "u1"}
	if err := db.SaveSocketSession(ctx, live, time.Hour); err != nil {
		t.Fatal(err)
	}
	// Saved again (a second disconnection): replaced, not duplicated.
	live.Rooms = `["room:a","room:b"]`
	if err := db.SaveSocketSession(ctx, live, time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, pid := range []string{"p-old1", "p-old2"} {
		if err := db.SaveSocketSession(ctx, models.SocketSession{PID: pid, SID: "s", Rooms: "[]"}, -time.Second); err != nil {
			t.Fatal(err)
		}
	}
	n, err := db.PurgeSocketSessions(ctx)
	if err != nil || n != 2 {
		t.Fatalf("purge = %d, %v; want the 2 expired", n, err)
	}
	got, ok, err := db.TakeSocketSession(ctx, "p-live")
	if err != nil || !ok || got != live {
		t.Fatalf("take = %+v %v %v, want %+v", got, ok, err, live)
	}
	if _, ok, err := db.TakeSocketSession(ctx, "p-live"); err != nil || ok {
		t.Fatalf("second take = %v %v, want none", ok, err)
	}
	if err := db.SaveSocketSession(ctx, models.SocketSession{PID: "p-exp", SID: "s", Rooms: "[]"}, -time.Second); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := db.TakeSocketSession(ctx, "p-exp"); err != nil || ok {
		t.Fatalf("take of an expired session = %v %v, want none", ok, err)
	}
}
