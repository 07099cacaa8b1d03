package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/zndraw/joblib/internal/limits"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// One error answers alike over REST and over a socket ack: the same status,
// problem type and Retry-After (classify is the one classifier). A lost
// database connection is 503 database-unavailable both ways (the ack said
// 500 "internal error" when the socket side had a classifier of its own),
// and a database budget spent is 503 statement-timeout both ways.
func TestErrorsAnswerAlikeOverRESTAndSocket(t *testing.T) {
	t.Parallel()
	discard := slog.New(slog.DiscardHandler)
	s := &Server{log: discard, rejections: limits.NewRejections()}
	rt := &Realtime{log: discard}
	spent, cancel := dbBudgetContext(context.Background(), time.Nanosecond)
	defer cancel()
	<-spent.Done()
	cases := []struct {
		name       string
		ctx        context.Context
		err        error
		status     int
		typ        string
		retryAfter bool
	}{
		{"connection lost", context.Background(), fmt.Errorf("claim: %w", models.ErrUnavailable), 503, "/v1/problems/database-unavailable", true},
		{"budget spent", spent, fmt.Errorf("claim: %w", context.DeadlineExceeded), 503, "/v1/problems/statement-timeout", true},
		{"disk full", context.Background(), fmt.Errorf("submit: %w", models.ErrStorageFull), 503, "/v1/problems/storage-full", true},
		{"room auth down", context.Background(), fmt.Errorf("ask: %w", errRoomAuthUnavailable), 503, "/v1/problems/room-auth-unavailable", false},
		{"not found", context.Background(), &joblib.Error{Code: joblib.CodeWorkerNotFound, Detail: "no such worker"}, 404, "/v1/problems/" + string(joblib.CodeWorkerNotFound), false},
		{"unauthorized", context.Background(), joblib.ErrUnauthorized, 401, "/v1/problems/" + string(joblib.CodeUnauthorized), false},
		{"anything else", context.Background(), errors.New("boom"), 500, "/v1/problems/internal-error", false},
	}
	for _, c := range cases {
		req := httptest.NewRequestWithContext(c.ctx, "POST", "/v1/joblib/tasks/claim-batch", nil)
		rec := httptest.NewRecorder()
		s.fail(rec, req, c.err)
		var p Problem
		if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
			t.Fatalf("%s: REST body %q: %v", c.name, rec.Body, err)
		}
		if rec.Code != c.status || p.Type != c.typ {
			t.Errorf("%s: REST answered %d %s, want %d %s", c.name, rec.Code, p.Type, c.status, c.typ)
		}
		a := rt.errAck(c.ctx, c.err)
		if a.OK || a.Status != rec.Code || a.Type != p.Type || a.Detail != p.Detail {
			t.Errorf("%s: ack %+v, REST %d %+v", c.name, a, rec.Code, p)
		}
		restRetry, _ := strconv.Atoi(rec.Header().Get("Retry-After"))
		if a.RetryAfter != restRetry || (restRetry > 0) != c.retryAfter {
			t.Errorf("%s: ack retry_after %d, REST Retry-After %q (want one: %v)", c.name, a.RetryAfter, rec.Header().Get("Retry-After"), c.retryAfter)
		}
	}
}
