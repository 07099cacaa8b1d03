package models_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// Ids travel as uuid.UUID through the pool's connections both ways, alone
// and in arrays, NULL included, in the binary format of prepared statements
// and the text format of the simple protocol, and still scan into strings.
func TestUUIDRoundTrip(t *testing.T) {
	t.Parallel()
	db := dbtest.Open(t, models.Postgres)
	ctx := context.Background()
	if direct, err := db.UUIDPlansDirect(ctx); err != nil || !direct {
		t.Fatalf("uuid.UUID goes through strings (%v)", err)
	}
	a, b := uuid.New(), uuid.New()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		var (
			got     uuid.UUID
			text    string
			arr     []uuid.UUID
			null    *uuid.UUID
			present *uuid.UUID
		)
		err := db.Pool.QueryRow(ctx, "SELECT $1::uuid, $1::uuid::text, ARRAY[$2::uuid, $1::uuid], NULL::uuid, $2::uuid", mode, a, b).
			Scan(&got, &text, &arr, &null, &present)
		if err != nil {
			t.Fatalf("mode %v: %v", mode, err)
		}
		if got != a || text != a.String() || len(arr) != 2 || arr[0] != b || arr[1] != a || null != nil || present == nil || *present != b {
			t.Fatalf("mode %v: %v %q %v %v %v", mode, got, text, arr, null, present)
		}
		var n int
		if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM unnest($1::uuid[]) u WHERE u = ANY($2::uuid[])", mode, []uuid.UUID{a, b, uuid.Nil}, []uuid.UUID{b, a}).Scan(&n); err != nil || n != 2 {
			t.Fatalf("mode %v: arrays as parameters: %d %v", mode, n, err)
		}
		var fromNull uuid.UUID
		if err := db.Pool.QueryRow(ctx, "SELECT NULL::uuid", mode).Scan(&fromNull); err == nil {
			t.Fatalf("mode %v: NULL scanned into a uuid.UUID without an error", mode)
		}
	}
}
