package models

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Statement failures a client caused (a value the database refuses, a
// cancelled or timed-out statement) are logged at debug level with the
// SQLSTATE only; other failures at error level with the SQL but never its
// arguments; and both map to the sentinels joblib answers with 422 and 503.
func TestStatementLogsNeverCarryArguments(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	l := newGormLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), time.Second)
	sql, args := l.(interface {
		ParamsFilter(context.Context, string, ...any) (string, []any)
	}).ParamsFilter(context.Background(), "INSERT INTO tasks (payload) VALUES ($1)", "SECRET")
	if len(args) != 0 || strings.Contains(sql, "SECRET") {
		t.Fatalf("ParamsFilter kept arguments: %q %v", sql, args)
	}
	stmt := func() (string, int64) { return "INSERT INTO tasks (payload) VALUES ('SECRET')", 0 }
	for _, code := range []string{"22P02", "22003", "22021", "57014"} {
		buf.Reset()
		err := fmt.Errorf("insert: %w", &pgconn.PgError{Code: code, Message: "SECRET detail"})
		l.Trace(context.Background(), time.Now(), stmt, err)
		if out := buf.String(); !strings.Contains(out, "level=DEBUG") || strings.Contains(out, "SECRET") {
			t.Errorf("%s logged as %q", code, out)
		}
	}
	if !IsInvalidData(mapErr(&pgconn.PgError{Code: "22003"})) || !IsTimeout(mapErr(&pgconn.PgError{Code: "57014"})) {
		t.Error("class 22 / 57014 not mapped to ErrInvalidData / ErrTimeout")
	}
	if IsInvalidData(mapErr(&pgconn.PgError{Code: "42P01"})) {
		t.Error("an undefined table is not the client's error")
	}
	buf.Reset()
	l.Trace(context.Background(), time.Now(), func() (string, int64) { return "SELECT 1 FROM nowhere", 0 }, &pgconn.PgError{Code: "42P01"})
	if out := buf.String(); !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "nowhere") {
		t.Errorf("a server fault was logged as %q", out)
	}
}
