package models

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// gormLogger sends gorm's statement logs to slog without ever including
// statement arguments (they carry client payloads): failures the client
// caused (bad data, a cancelled or timed-out statement) are logged at debug
// level with the SQLSTATE only, other failures at error level with the
// parameterized SQL, slow statements at warn level.
type gormLogger struct {
	log  *slog.Logger
	slow time.Duration
}

func newGormLogger(log *slog.Logger, slow time.Duration) logger.Interface {
	return &gormLogger{log: log, slow: slow}
}

func (l *gormLogger) LogMode(logger.LogLevel) logger.Interface { return l }

func (l *gormLogger) Info(ctx context.Context, msg string, data ...any) {
	l.log.DebugContext(ctx, fmt.Sprintf(msg, data...))
}

func (l *gormLogger) Warn(ctx context.Context, msg string, data ...any) {
	l.log.WarnContext(ctx, fmt.Sprintf(msg, data...))
}

func (l *gormLogger) Error(ctx context.Context, msg string, data ...any) {
	l.log.ErrorContext(ctx, fmt.Sprintf(msg, data...))
}

// ParamsFilter drops the arguments from the SQL gorm renders for logs.
func (l *gormLogger) ParamsFilter(_ context.Context, sql string, _ ...any) (string, []any) {
	return sql, nil
}

func (l *gormLogger) Trace(ctx context.Context, begin time.Time, fc func() (string, int64), err error) {
	elapsed := time.Since(begin)
	switch {
	case err != nil && errors.Is(err, gorm.ErrRecordNotFound):
	case err != nil && clientCaused(err):
		if l.log.Enabled(ctx, slog.LevelDebug) {
			l.log.LogAttrs(ctx, slog.LevelDebug, "statement refused", slog.String("sqlstate", sqlState(err)),
				slog.Duration("took", elapsed))
		}
	case err != nil:
		sql, _ := fc()
		l.log.LogAttrs(ctx, slog.LevelError, "statement failed", slog.String("sql", sql),
			slog.String("sqlstate", sqlState(err)), slog.Duration("took", elapsed))
	case l.slow > 0 && elapsed > l.slow:
		sql, _ := fc()
		l.log.LogAttrs(ctx, slog.LevelWarn, "slow statement", slog.String("sql", sql), slog.Duration("took", elapsed))
	}
}

// sqlState is the PostgreSQL error code of err, or "" (SQLite, Go errors).
func sqlState(err error) string {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code
	}
	return ""
}

// clientCaused reports whether a statement failed because of what the
// client sent or how long its request may take, not because of a fault.
func clientCaused(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		isInvalidData(err) || isStatementTimeout(err)
}

// isInvalidData: PostgreSQL refused a value (class 22, data exception:
// numeric out of range, invalid text representation, invalid JSON, NUL...).
func isInvalidData(err error) bool {
	c := sqlState(err)
	return len(c) == 5 && c[:2] == "22"
}

// isConnLost: the connection under the statement is gone. PostgreSQL
// terminated the backend (57P01 admin shutdown, 57P02 crash shutdown, 57P03
// cannot connect now) or reported a connection exception (class 08), or the
// driver found the connection closed or the network broken. A context that
// ended is the caller's doing, never a lost connection.
func isConnLost(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	switch c := sqlState(err); {
	case c == "57P01", c == "57P02", c == "57P03":
		return true
	case len(c) == 5 && c[:2] == "08":
		return true
	case c != "":
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	var ce *pgconn.ConnectError
	return errors.As(err, &ce) || strings.Contains(err.Error(), "conn closed")
}

// isStorageFull: the database ran out of space (SQLite's SQLITE_FULL, the
// primary result code 13; PostgreSQL's 53100 disk_full).
func isStorageFull(err error) bool {
	if sqlState(err) == "53100" {
		return true
	}
	var coded interface{ Code() int }
	return errors.As(err, &coded) && coded.Code()&0xff == 13
}

// IsStorageFull reports whether err is the database out of space
// (ErrStorageFull, or the driver error behind it).
func IsStorageFull(err error) bool {
	return errors.Is(err, ErrStorageFull) || (err != nil && isStorageFull(err))
}

// IsUnavailable reports whether err is a lost database connection
// (ErrUnavailable, or the driver error behind it).
func IsUnavailable(err error) bool {
	return errors.Is(err, ErrUnavailable) || (err != nil && isConnLost(err))
}

// isStatementTimeout: PostgreSQL cancelled the statement (57014: the
// statement_timeout, or a cancel request sent for a context deadline).
func isStatementTimeout(err error) bool {
	return sqlState(err) == "57014"
}

// IsInvalidData reports whether err is the database refusing a value the
// client sent (ErrInvalidData, or the driver error behind it).
func IsInvalidData(err error) bool {
	return errors.Is(err, ErrInvalidData) || isInvalidData(err)
}

// IsTimeout reports whether err is a statement cancelled by its time
// budget (ErrTimeout, PostgreSQL's 57014, or a context deadline).
func IsTimeout(err error) bool {
	return errors.Is(err, ErrTimeout) || isStatementTimeout(err) || errors.Is(err, context.DeadlineExceeded)
}
