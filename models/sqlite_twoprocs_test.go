package models

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/google/uuid"
)

// TestSQLiteTransactionsOfTwoProcessesWaitForEachOther: an operator command
// opens the SQLite file a running server has open, and both write. A
// transaction that read before it wrote, while the other process committed
// in between, failed at once with "database is locked (517)"
// (SQLITE_BUSY_SNAPSHOT, which the busy timeout cannot wait out): a CLI
// command failed against a busy server. Transactions now take the write lock
// when they begin, and wait for it.
func TestSQLiteTransactionsOfTwoProcessesWaitForEachOther(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "shared.db")
	open := func() *DB {
		db, err := Open(ctx, path, OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	server := open()
	if _, err := server.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	operator := open()
	const each = 150
	var wg sync.WaitGroup
	errs := make(chan error, 2*each)
	for p, db := range []*DB{server, operator} {
		wg.Go(func() {
			for i := range each {
				err := db.Tx(ctx, func(q *Q) error {
					var n int64
					if err := q.g.Raw("SELECT count(*) FROM users").Scan(&n).Error; err != nil {
						return err
					}
					return q.g.Exec("INSERT INTO users (id, name) VALUES (?, ?)", uuid.NewString(), fmt.Sprintf("p%d-%d-after-%d", p, i, n)).Error
				})
				if err != nil {
					errs <- fmt.Errorf("process %d, transaction %d: %w", p, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var n int64
	if err := server.Q(ctx).g.Raw("SELECT count(*) FROM users").Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	if n != 2*each {
		t.Fatalf("%d users written, want %d", n, 2*each)
	}
}
