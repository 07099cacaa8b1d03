package models_test

import (
	"context"
	"testing"
	"time"

	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// LockUser serialises one user's quota checks on PostgreSQL: while one
// transaction holds it, another transaction's LockUser for the same user
// waits for that commit (a count-then-insert in each could otherwise both
// pass the cap).
func TestLockUserSerialisesQuotaChecks(t *testing.T) {
	t.Parallel()
	db := dbtest.Open(t, models.Postgres)
	f := newFixture(t, db)
	ctx := context.Background()
	const hold = 300 * time.Millisecond
	locked := make(chan struct{})
	var released time.Time
	first := make(chan error, 1)
	go func() {
		first <- db.Tx(ctx, func(q *models.Q) error {
			if err := q.LockUser(f.user); err != nil {
				return err
			}
			close(locked)
			time.Sleep(hold) // hold the lock: the second transaction must wait for it
			released = time.Now()
			return nil
		})
	}()
	<-locked
	var acquired time.Time
	if err := db.Tx(ctx, func(q *models.Q) error {
		if err := q.LockUser(f.user); err != nil {
			return err
		}
		acquired = time.Now()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if acquired.Before(released) {
		t.Fatalf("a second transaction took the user's quota lock %s before the first released it", released.Sub(acquired))
	}
}
