package models

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"modernc.org/sqlite"
)

// withCache runs fn on the statement cache of the database's one SQLite
// connection.
func withCache(t *testing.T, db *DB, fn func(c *stmtCacheConn)) {
	t.Helper()
	sqlDB, err := db.gorm.DB()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := sqlDB.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	err = conn.Raw(func(dc any) error {
		c, ok := dc.(*stmtCacheConn)
		if !ok {
			return fmt.Errorf("the SQLite connection is a %T, not a statement cache", dc)
		}
		fn(c)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

type cacheCounts struct{ prepared, reused, cached, stmtBytes int }

func countsOf(t *testing.T, db *DB) cacheCounts {
	t.Helper()
	var n cacheCounts
	withCache(t, db, func(c *stmtCacheConn) {
		n = cacheCounts{prepared: c.prepared, reused: c.reused, cached: len(c.stmts)}
		st, ok := c.Unwrap().(sqlite.DBStatus)
		if !ok {
			t.Fatalf("%T has no Status", c.Unwrap())
		}
		used, _, err := st.Status(sqlite.DBStatusStmtUsed, false)
		if err != nil {
			t.Fatal(err)
		}
		n.stmtBytes = used
	})
	return n
}

// The same SQL run again, in a transaction or outside one, runs the
// statement compiled the first time: one compilation for eight executions,
// and SQLite holds the compiled statement while no statement runs.
func TestSQLiteStatementCacheReusesStatements(t *testing.T) {
	t.Parallel()
	db, _ := openSQLite(t)
	ctx := context.Background()
	const query = "SELECT count(*) FROM users WHERE name = ? AND is_active"
	count := func(q *Q) error {
		var n int
		if err := q.g.Raw(query, "nobody").Scan(&n).Error; err != nil {
			return err
		}
		if n != 0 {
			return fmt.Errorf("count = %d, want 0", n)
		}
		return nil
	}
	before := countsOf(t, db)
	if err := count(db.Q(ctx)); err != nil {
		t.Fatal(err)
	}
	first := countsOf(t, db)
	if first.prepared != before.prepared+1 || first.stmtBytes <= before.stmtBytes {
		t.Fatalf("first run: %+v -> %+v, want one statement compiled and kept", before, first)
	}
	for range 3 {
		if err := db.Tx(ctx, count); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Tx(ctx, func(q *Q) error {
		if err := count(q); err != nil {
			return err
		}
		return count(q)
	}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := count(db.Q(ctx)); err != nil {
			t.Fatal(err)
		}
	}
	after := countsOf(t, db)
	if after.prepared != first.prepared || after.reused != first.reused+7 || after.cached != first.cached {
		t.Fatalf("seven more runs: %+v -> %+v, want no compilation and 7 reuses", first, after)
	}
}

// SQL run again while rows of its cached statement are still open (the same
// transaction, the rows not yet read) runs uncached, and both result sets
// come out whole.
func TestSQLiteStatementCacheSameSQLWhileRowsOpen(t *testing.T) {
	t.Parallel()
	db, _ := openSQLite(t)
	ctx := context.Background()
	for _, name := range []string{"a", "b", "c"} {
		if _, err := db.Q(ctx).CreateUser(name, false); err != nil {
			t.Fatal(err)
		}
	}
	const query = "SELECT name FROM users WHERE name <> ? ORDER BY name"
	err := db.Tx(ctx, func(q *Q) error {
		rows, err := q.g.Raw(query, "").Rows()
		if err != nil {
			return err
		}
		defer rows.Close()
		var outer []string
		for rows.Next() {
			var name string
			if err := rows.Scan(&name); err != nil {
				return err
			}
			outer = append(outer, name)
			var inner []string
			if err := q.g.Raw(query, name).Scan(&inner).Error; err != nil {
				return err
			}
			if len(inner) != 2 {
				return fmt.Errorf("inner run without %q = %v, want the 2 other names", name, inner)
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if got := strings.Join(outer, ","); got != "a,b,c" {
			return fmt.Errorf("outer rows = %s, want a,b,c", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// countingConnector counts what the statement cache asks of the driver:
// statements compiled (prepared) and finalized (closed).
type countingConnector struct {
	driver.Connector
	prepared, closed *atomic.Int64
}

func (c countingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &countingConn{sqliteConn: conn.(sqliteConn), c: c}, nil
}

type countingConn struct {
	sqliteConn
	c countingConnector
}

func (c *countingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	s, err := c.sqliteConn.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	c.c.prepared.Add(1)
	return &countingStmt{sqliteStmt: s.(sqliteStmt), closed: c.c.closed}, nil
}

type countingStmt struct {
	sqliteStmt
	closed *atomic.Int64
}

func (s *countingStmt) Close() error {
	s.closed.Add(1)
	return s.sqliteStmt.Close()
}

// A connection keeps at most its bound of statements, least recently used
// out first; one evicted while its rows are open is finalized when they
// close; closing the connection finalizes the rest, and the file is then
// free (switching it out of WAL needs every other connection gone).
func TestSQLiteStatementCacheBoundAndClose(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "cache.db")
	base, err := sqlite.NewConnector(path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	var prepared, closed atomic.Int64
	db := sql.OpenDB(stmtCacheConnector{Connector: countingConnector{base, &prepared, &closed}, size: 2})
	db.SetMaxOpenConns(1)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "CREATE TABLE t (v INTEGER)"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO t VALUES (1), (2), (3)"); err != nil {
		t.Fatal(err)
	}
	check := func(when string, wantPrepared, wantClosed int64) {
		t.Helper()
		if p, c := prepared.Load(), closed.Load(); p != wantPrepared || c != wantClosed {
			t.Fatalf("%s: %d compiled, %d finalized; want %d, %d", when, p, c, wantPrepared, wantClosed)
		}
	}
	check("two statements", 2, 0)

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := tx.QueryContext(ctx, "SELECT v FROM t ORDER BY v")
	if err != nil {
		t.Fatal(err)
	}
	check("a third evicts the first", 3, 1)
	if !rows.Next() {
		t.Fatalf("no first row: %v", rows.Err())
	}
	for _, q := range []string{"SELECT 1", "SELECT 2"} { // evict the open SELECT
		var n int
		if err := tx.QueryRowContext(ctx, q).Scan(&n); err != nil {
			t.Fatal(err)
		}
	}
	check("two more, the open one evicted but not finalized", 5, 2)
	var sum int
	for ok := true; ok; ok = rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		sum += v
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	if sum != 6 {
		t.Fatalf("rows read across the eviction sum to %d, want 6", sum)
	}
	check("its rows closed", 5, 3)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	check("connection closed", 5, 5)

	other, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	var mode string
	if err := other.QueryRowContext(ctx, "PRAGMA journal_mode=DELETE").Scan(&mode); err != nil || mode != "delete" {
		t.Fatalf("journal_mode=DELETE after close = %q, %v; want delete (no connection left on the file)", mode, err)
	}
}
