package models

import (
	"container/list"
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
)

// SQLite statement cache.
//
// Compiling a statement (sqlite3_prepare) took about a third of the server's
// CPU on SQLite (bench/claim) while every execution compiled its statement
// again. modernc.org/sqlite keeps the compiled statement inside a prepared
// driver.Stmt, so keeping those per connection saves the compilation.
//
// The cache sits under database/sql, on each driver connection, rather than
// in gorm's PrepareStmt: gorm prepares a statement first seen inside a
// transaction on that *sql.Tx, which closes it at commit, and database/sql
// then compiles it again in every later transaction. Nearly all of joblib's
// statements run in transactions, so gorm's cache would skip most of them.
// Here, in a transaction or not, a connection asked to run SQL text it has run
// before runs the statement it compiled then.

// stmtCacheSize bounds the statements one connection keeps. joblib has about
// a hundred distinct statements, but the SQL of an IN list differs with the
// list's length (gorm writes one "?" per element), and the bound keeps those
// from growing the cache without limit.
const stmtCacheSize = 256

// sqliteConn is what the statement cache needs of a modernc.org/sqlite
// connection, and what it must forward (the optional interfaces the driver
// implements; database/sql falls back to weaker paths without them).
type sqliteConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.Pinger
	driver.SessionResetter
	driver.Validator
}

// sqliteStmt is a prepared statement of the driver.
type sqliteStmt interface {
	driver.Stmt
	driver.StmtExecContext
	driver.StmtQueryContext
}

// sqliteRows is the driver's result set, with the column-type interfaces
// database/sql's ColumnTypes reads.
type sqliteRows interface {
	driver.Rows
	driver.RowsColumnTypeDatabaseTypeName
	driver.RowsColumnTypeLength
	driver.RowsColumnTypeNullable
	driver.RowsColumnTypePrecisionScale
	driver.RowsColumnTypeScanType
}

// stmtCacheConnector opens the driver's connections, each with its own
// statement cache. It is what sql.OpenDB is given.
type stmtCacheConnector struct {
	driver.Connector
	size int
}

// Connect opens one connection and wraps it.
func (c stmtCacheConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	sc, ok := conn.(sqliteConn)
	if !ok {
		return nil, errors.Join(fmt.Errorf("sqlite connection %T lacks the context methods the statement cache needs", conn), conn.Close())
	}
	return &stmtCacheConn{sqliteConn: sc, max: max(c.size, 1), stmts: map[string]*cachedStmt{}}, nil
}

// stmtCacheConn is one driver connection with the statements it compiled,
// by SQL text, least recently used last. database/sql uses a connection from
// one goroutine at a time (its driverConn lock covers every call, rows' Next
// and Close included), so the cache needs no lock of its own.
type stmtCacheConn struct {
	sqliteConn
	max   int
	stmts map[string]*cachedStmt
	lru   list.List // of *cachedStmt, most recently used first

	// prepared and reused count compilations and cache hits (tests read them).
	prepared, reused int
}

// cachedStmt is a compiled statement. busy: rows read from it are open, so it
// cannot run again until they close; evicted: it left the cache while busy
// and is finalized when its rows close.
type cachedStmt struct {
	query         string
	stmt          sqliteStmt
	elem          *list.Element
	busy, evicted bool
}

// Unwrap returns the driver's connection (modernc's helpers, such as Limit,
// look through wrappers this way).
func (c *stmtCacheConn) Unwrap() driver.Conn { return c.sqliteConn }

// ExecContext runs query with the connection's compiled statement for it.
func (c *stmtCacheConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	s, err := c.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	if s == nil {
		return c.sqliteConn.ExecContext(ctx, query, args)
	}
	return s.stmt.ExecContext(ctx, args)
}

// QueryContext runs query with the connection's compiled statement for it;
// the statement stays busy until the rows close.
func (c *stmtCacheConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	s, err := c.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	if s == nil {
		return c.sqliteConn.QueryContext(ctx, query, args)
	}
	rows, err := s.stmt.QueryContext(ctx, args)
	if err != nil {
		return nil, err
	}
	r, ok := rows.(sqliteRows)
	if !ok {
		return nil, errors.Join(fmt.Errorf("sqlite rows %T lack the column-type methods", rows), rows.Close())
	}
	s.busy = true
	return &cachedRows{sqliteRows: r, s: s}, nil
}

// stmt returns the compiled statement for query, compiling and caching it
// on first use. It returns nil, nil when the cached statement is busy (the
// same SQL run again while its rows are read): the caller then runs the SQL
// uncached.
func (c *stmtCacheConn) stmt(ctx context.Context, query string) (*cachedStmt, error) {
	if s, ok := c.stmts[query]; ok {
		if s.busy {
			return nil, nil
		}
		c.lru.MoveToFront(s.elem)
		c.reused++
		return s, nil
	}
	ds, err := c.sqliteConn.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	st, ok := ds.(sqliteStmt)
	if !ok {
		return nil, errors.Join(fmt.Errorf("sqlite statement %T lacks the context methods", ds), ds.Close())
	}
	c.prepared++
	s := &cachedStmt{query: query, stmt: st}
	s.elem = c.lru.PushFront(s)
	c.stmts[query] = s
	if c.lru.Len() > c.max {
		// The statement just compiled is valid and stays cached; an error
		// finalizing the old one is still reported, to this caller.
		if err := c.evict(c.lru.Back().Value.(*cachedStmt)); err != nil {
			return nil, fmt.Errorf("finalize a statement evicted from the cache: %w", err)
		}
	}
	return s, nil
}

// evict drops s from the cache and finalizes it, or marks it to be finalized
// when its open rows close.
func (c *stmtCacheConn) evict(s *cachedStmt) error {
	c.lru.Remove(s.elem)
	delete(c.stmts, s.query)
	if s.busy {
		s.evicted = true
		return nil
	}
	return s.stmt.Close()
}

// Close finalizes every cached statement, then closes the connection. The
// statements must go first: SQLite keeps a connection with unfinalized
// statements open (and its file locks held) after sqlite3_close_v2.
// database/sql closes a connection only once no rows of it are open.
func (c *stmtCacheConn) Close() error {
	var errs []error
	for c.lru.Len() > 0 {
		errs = append(errs, c.evict(c.lru.Front().Value.(*cachedStmt)))
	}
	errs = append(errs, c.sqliteConn.Close())
	return errors.Join(errs...)
}

// cachedRows are rows read from a cached statement; closing them frees the
// statement for its next run (the driver resets it).
type cachedRows struct {
	sqliteRows
	s      *cachedStmt
	closed bool
}

func (r *cachedRows) Close() error {
	if r.closed {
		return nil
	}
	r.closed = true
	err := r.sqliteRows.Close()
	r.s.busy = false
	if r.s.evicted {
		err = errors.Join(err, r.s.stmt.Close())
	}
	return err
}
