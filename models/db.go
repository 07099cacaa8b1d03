package models

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
)

// Dialect names the database family behind a DB.
type Dialect string

const (
	// Postgres is PostgreSQL reached through pgx.
	Postgres Dialect = "postgres"
	// SQLite is the embedded, pure-Go SQLite used by default.
	SQLite Dialect = "sqlite"
)

// DB is the handle to joblib's database. It is safe for concurrent use.
type DB struct {
	gorm    *gorm.DB
	dialect Dialect
	// Pool is the pgx pool shared by gorm and raw pgx work (LISTEN/NOTIFY,
	// advisory locks). Nil on SQLite.
	Pool *pgxpool.Pool
	dsn  string
}

// OpenOptions tunes Open. The zero value is fine.
type OpenOptions struct {
	// Logger receives gorm's slow-query and error logs. Default: discard.
	Logger *slog.Logger
	// MaxConns caps the PostgreSQL pool. Default 20. SQLite always uses one
	// connection: it has a single writer, and one connection keeps every
	// transaction strictly serialised without busy retries.
	MaxConns int32
	// MustExist refuses to create a database: a missing SQLite file is
	// ErrNoDatabase (operator commands never create one by accident).
	MustExist bool
	// Statements, when set, is incremented for every statement sent to
	// PostgreSQL (BEGIN and COMMIT included): benchmarks report it. Not
	// counted on SQLite.
	Statements *atomic.Int64
}

// statementCounter is a pgx tracer that counts statements.
type statementCounter struct{ n *atomic.Int64 }

func (c statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// The statements of a pgx batch (one round trip) are counted one by one.
func (statementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c statementCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	c.n.Add(1)
}

func (statementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// Open connects to the database named by rawURL: a postgres:// or postgresql://
// URL selects PostgreSQL; a plain path, optionally prefixed with sqlite:// or
// file:, a SQLite file; other schemes are refused (see ParseURL). It does not
// run migrations (see Migrate).
func Open(ctx context.Context, rawURL string, opts OpenOptions) (*DB, error) {
	dialect, path, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	if dialect == SQLite {
		if err := checkSQLiteFile(path, opts.MustExist); err != nil {
			return nil, err
		}
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	gcfg := &gorm.Config{
		TranslateError: true,
		Logger:         newGormLogger(log, time.Second),
		NowFunc:        func() time.Time { return time.Now().UTC() },
	}
	if dialect == Postgres {
		pcfg, err := pgxpool.ParseConfig(rawURL)
		if err != nil {
			return nil, fmt.Errorf("parse database url: %w", err)
		}
		pcfg.MaxConns = 20
		if opts.Statements != nil {
			pcfg.ConnConfig.Tracer = statementCounter{opts.Statements}
		}
		pcfg.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
			registerUUID(c)
			return nil
		}
		if opts.MaxConns > 0 {
			pcfg.MaxConns = opts.MaxConns
		}
		pool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			return nil, fmt.Errorf("open postgres pool: %w", err)
		}
		if err := pool.Ping(ctx); err != nil {
			pool.Close()
			return nil, fmt.Errorf("connect to postgres: %w", err)
		}
		sqlDB := stdlib.OpenDBFromPool(pool)
		g, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), gcfg)
		if err != nil {
			pool.Close()
			return nil, fmt.Errorf("open gorm on postgres: %w", err)
		}
		return &DB{gorm: g, dialect: Postgres, Pool: pool, dsn: rawURL}, nil
	}

	q := url.Values{}
	q.Add("_pragma", "foreign_keys(1)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "synchronous(NORMAL)")
	// Transactions take the write lock when they begin (BEGIN IMMEDIATE),
	// so the busy timeout covers them. An operator command opens the file a
	// running server has open; a deferred transaction that read and then
	// wrote while the other process held or had just committed a write
	// failed at once with "database is locked" (SQLITE_BUSY or
	// SQLITE_BUSY_SNAPSHOT, which no wait resolves). Within one process
	// nothing changes: its single connection runs one transaction at a time.
	q.Add("_txlock", "immediate")
	// time.Time arguments as "2006-01-02 15:04:05.999999999-07:00" (joblib
	// passes its own Time, which writes text itself; this keeps any other
	// time the form the previous driver wrote, not time.Time.String()).
	q.Add("_time_format", "sqlite")
	dsn := path + "?" + q.Encode()
	// gorm's PrepareStmt stays off: the dialector's connection caches its
	// compiled statements itself, inside transactions too (see
	// sqlite_stmtcache.go for why gorm's cache would not).
	g, err := gorm.Open(sqliteDialector{DSN: dsn}, gcfg)
	if err != nil {
		return nil, sqliteOpenError(path, err)
	}
	sqlDB, err := g.DB()
	if err != nil {
		return nil, sqliteOpenError(path, err)
	}
	sqlDB.SetMaxOpenConns(1)
	sqlDB.SetMaxIdleConns(1)
	sqlDB.SetConnMaxLifetime(0)
	if err := sqlDB.PingContext(ctx); err != nil {
		return nil, sqliteOpenError(path, err)
	}
	return &DB{gorm: g, dialect: SQLite, dsn: rawURL}, nil
}

// Dialect reports which database this is.
func (db *DB) Dialect() Dialect { return db.dialect }

// URL is the database URL the handle was opened with.
func (db *DB) URL() string { return db.dsn }

// Close releases every connection.
func (db *DB) Close() error {
	sqlDB, err := db.gorm.DB()
	if err == nil {
		err = sqlDB.Close()
	}
	if db.Pool != nil {
		db.Pool.Close()
	}
	return err
}

// Ping checks that the database answers.
func (db *DB) Ping(ctx context.Context) error {
	var one int
	return db.gorm.WithContext(ctx).Raw("SELECT 1").Scan(&one).Error
}

// Q is a query surface bound to either the pool or one transaction. Every
// query joblib runs is a method of Q.
type Q struct {
	g *gorm.DB
	d Dialect
}

// Context is the context q's statements run under (the request's, for
// work a request started).
func (q *Q) Context() context.Context { return q.g.Statement.Context }

// Q returns queries that run outside any transaction.
func (db *DB) Q(ctx context.Context) *Q {
	return &Q{g: db.gorm.WithContext(ctx), d: db.dialect}
}

// Tx runs fn in one transaction: committed when fn returns nil, rolled back
// otherwise (and on panic). A transaction PostgreSQL aborts as a deadlock
// victim or serialization failure is retried from the start (fn must be
// safe to re-run: it only talks to q).
func (db *DB) Tx(ctx context.Context, fn func(q *Q) error) error {
	const attempts = 5
	var err error
	for i := range attempts {
		err = db.gorm.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			return fn(&Q{g: tx, d: db.dialect})
		})
		if !retryable(err) || i == attempts-1 {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(i+1) * 5 * time.Millisecond):
		}
	}
	return mapErr(err)
}

// retryable reports whether PostgreSQL aborted the transaction for a reason
// that a plain retry resolves, or the transaction failed before anything
// was sent on its connection (a pooled connection found dead).
func retryable(err error) bool {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code == "40P01" || pg.Code == "40001"
	}
	return err != nil && pgconn.SafeToRetry(err)
}

// Dialect reports which database the queries run on.
func (q *Q) Dialect() Dialect { return q.d }

// Notify sends a NOTIFY on channel as part of q's transaction (PostgreSQL
// delivers it when the transaction commits, and never if it rolls back).
func (q *Q) Notify(channel, payload string) error {
	if err := q.g.Exec("SELECT pg_notify(?, ?)", channel, payload).Error; err != nil {
		return fmt.Errorf("notify %s: %w", channel, mapErr(err))
	}
	return nil
}

// Sentinel errors returned by this package.
var (
	// ErrNotFound means the row does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict means a unique or foreign-key constraint rejected the write.
	ErrConflict = errors.New("conflict")
	// ErrInvalidData means the database refused a value the client sent
	// (out of range, not representable).
	ErrInvalidData = errors.New("invalid data")
	// ErrTimeout means the statement ran past its time budget (the
	// request's deadline or PostgreSQL's statement_timeout) and was
	// cancelled.
	ErrTimeout = errors.New("statement timeout")
	// ErrUnavailable means the database connection was lost under the
	// statement (the backend was terminated, the server shut down or
	// restarted, the network dropped it): the request may be retried.
	ErrUnavailable = errors.New("database unavailable")
	// ErrStorageFull means the database could not write for lack of space
	// (SQLite's SQLITE_FULL, PostgreSQL's disk_full): nothing of the
	// statement was committed.
	ErrStorageFull = errors.New("storage full")
)

func mapErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrConflict), errors.Is(err, ErrInvalidData), errors.Is(err, ErrTimeout), errors.Is(err, ErrUnavailable), errors.Is(err, ErrStorageFull):
		return err
	case isStorageFull(err):
		return fmt.Errorf("%w: %w", ErrStorageFull, err)
	case isConnLost(err):
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	case isInvalidData(err):
		return fmt.Errorf("%w: %w", ErrInvalidData, err)
	case isStatementTimeout(err):
		return fmt.Errorf("%w: %w", ErrTimeout, err)
	case errors.Is(err, gorm.ErrRecordNotFound):
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	case errors.Is(err, gorm.ErrDuplicatedKey), errors.Is(err, gorm.ErrForeignKeyViolated):
		return fmt.Errorf("%w: %w", ErrConflict, err)
	}
	// The SQLite dialector translates unique and foreign-key violations;
	// other constraints (NOT NULL, CHECK) and errors read outside gorm (rows
	// scanned by hand) arrive as text.
	msg := err.Error()
	if strings.Contains(msg, "constraint failed") {
		return fmt.Errorf("%w: %w", ErrConflict, err)
	}
	return err
}

// now is the database clock as an SQL expression. Every timestamp joblib stores
// comes from here, so liveness never mixes clocks.
func (q *Q) now() string {
	if q.d == Postgres {
		return "now()"
	}
	return sqliteNow
}

const sqliteNow = "strftime('%Y-%m-%dT%H:%M:%fZ','now')"

// before returns an SQL expression for "database now minus d" and its argument.
func (q *Q) before(d time.Duration) (string, any) {
	if q.d == Postgres {
		return "(now() - ? * interval '1 microsecond')", d.Microseconds()
	}
	return "strftime('%Y-%m-%dT%H:%M:%fZ','now', ?)", fmt.Sprintf("-%.3f seconds", d.Seconds())
}
