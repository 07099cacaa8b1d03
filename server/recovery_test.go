package server_test

import (
	"cmp"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// runRecovery runs testdata/node/recovery.mjs against e (reconnecting to
// reconnect) expecting "recovered" or "fresh".
func runRecovery(t *testing.T, e *env, reconnect, room, expect string, extra ...string) {
	t.Helper()
	dir := nodeClientDir(t)
	env := append([]string{"JOBLIB_URL=" + e.url, "RECONNECT_URL=" + reconnect, "UI_TOKEN=" + e.bob,
		"WORKER_TOKEN=" + e.alice, "ROOM=" + room, "EXPECT=" + expect}, extra...)
	runClient(t, env, "node", filepath.Join(dir, "recovery.mjs"))
}

// TestNodeClientRecovery: a UI whose engine is closed reconnects with
// socket.recovered true and gets every event it missed once, in order, on
// one node (SQLite; PostgreSQL with its NOTIFY bus); past the window it gets
// a fresh session and nothing replayed.
func TestNodeClientRecovery(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		opts := func(window time.Duration) []func(*setupOpts) {
			cfg := realtimeCfg()
			cfg.RecoveryWindow = window
			o := []func(*setupOpts){withRealtime(cfg)}
			if db.Dialect() == models.Postgres {
				bus := events.NewPGBus(db.Pool, "recovery-"+window.String(), nil)
				if err := bus.Start(context.Background()); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(bus.Stop)
				o = append(o, withBus(bus))
			}
			return o
		}
		t.Run("within the window", func(t *testing.T) {
			e := setup(t, db, opts(time.Minute)...)
			runRecovery(t, e, e.url, "rec-in", "recovered")
		})
		t.Run("past the window", func(t *testing.T) {
			e := setup(t, db, opts(700*time.Millisecond)...)
			runRecovery(t, e, e.url, "rec-out", "fresh", "AWAY_MS=1500")
		})
	})
}

// TestNodeClientRecoveryOnAnotherNode: on PostgreSQL the UI recovers on a
// node other than the one it lost: both deliver the bus's batches in one
// order under the same offsets, and the session is in the database.
func TestNodeClientRecoveryOnAnotherNode(t *testing.T) {
	t.Parallel()
	a, b := twoNodes(t)
	runRecovery(t, a, b.url, "rec-ab", "recovered")
}

// TestNodeClientRecoveryOnAnotherNodeNATS: with the NATS bus, whose server
// orders each publisher's messages but not their interleaving across
// subscribers, an offset from one node may not mean the same on another, so
// a UI that reconnects to another node gets a fresh session (and refetches)
// rather than a replay in another order.
func TestNodeClientRecoveryOnAnotherNodeNATS(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t, models.Postgres)
	natsURL := cmp.Or(os.Getenv("JOBLIB_TEST_NATS_URL"), "nats://127.0.0.1:4222")
	subject := "joblib.test." + uuid.NewString()
	node := func(name string) (*models.DB, events.Bus) {
		db, err := models.Open(context.Background(), url, models.OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		if _, err := db.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
		bus := events.NewNATSBus(natsURL, subject, name, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := bus.Start(ctx); err != nil {
			t.Fatalf("%v (run: bash scripts/test.sh, which starts nats-server)", err)
		}
		t.Cleanup(bus.Stop)
		return db, bus
	}
	dbA, busA := node("na")
	dbB, busB := node("nb")
	a := setup(t, dbA, withBus(busA), withRealtime(realtimeCfg()))
	b := setupShared(t, dbB, busB, a)
	runRecovery(t, a, b.url, "rec-nats", "fresh")
}
