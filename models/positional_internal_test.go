package models

import (
	"context"
	"reflect"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// positional rewrites each hot statement exactly as pgx's named arguments
// would, on the first call (which learns the order) and on later ones
// (which reuse it), with the values in their places; an argument missing
// from a call is NULL, as in pgx.
func TestPositionalMatchesPgxRewrite(t *testing.T) {
	ctx := context.Background()
	n := HotNotify{Channel: "c", Head: "h", Open: "o", Middle: "m", Close: "c", Tail: "t", RoomPrefix: "room:", MaxBytes: 8000, ID: 7}
	result := "r"
	one := []HotUpdate{{ID: uuid.New(), User: uuid.New(), Status: "running"}}
	two := append(one, HotUpdate{ID: uuid.New(), User: uuid.New(), Status: "completed", Result: &result})
	single, singleArgs := updateArgs(one, []string{"claimed>running"}, n)
	batch, batchArgs := updateArgs(two, []string{"claimed>running"}, n)
	missing := claimArgs(uuid.New(), uuid.New(), 3, false, n)
	delete(missing, "limit")
	for name, c := range map[string]struct {
		sql  string
		args func() pgx.NamedArgs
	}{
		"claim": {claimSQL, func() pgx.NamedArgs { return claimArgs(uuid.New(), uuid.New(), 1, true, n) }},
		"submit": {submitSQL, func() pgx.NamedArgs {
			return submitArgs(uuid.New(), "r", "c", "j", "r", uuid.New(), "{}", nil, 10, n, AvailableFrame{})
		}},
		"update one":    {single, func() pgx.NamedArgs { return singleArgs }},
		"update batch":  {batch, func() pgx.NamedArgs { return batchArgs }},
		"missing limit": {claimSQL, func() pgx.NamedArgs { return missing }},
	} {
		for call := range 3 {
			args := c.args()
			wantSQL, wantArgs, err := args.RewriteQuery(ctx, nil, c.sql, nil)
			if err != nil {
				t.Fatal(err)
			}
			gotSQL, gotArgs, err := positional(ctx, c.sql, args)
			if err != nil {
				t.Fatal(err)
			}
			if gotSQL != wantSQL || !reflect.DeepEqual(gotArgs, wantArgs) {
				t.Fatalf("%s, call %d: positional gave\n%s\n%v\npgx gives\n%s\n%v", name, call, gotSQL, gotArgs, wantSQL, wantArgs)
			}
		}
	}
}

// BenchmarkPositional compares the cached rewrite of the claim statement
// with pgx's rewrite on every call.
//
//	go test -run '^$' -bench BenchmarkPositional ./models
func BenchmarkPositional(b *testing.B) {
	ctx := context.Background()
	args := claimArgs(uuid.New(), uuid.New(), 1, false, HotNotify{Channel: "c", MaxBytes: 8000})
	b.Run("pgx", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := args.RewriteQuery(ctx, nil, claimSQL, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cached", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := positional(ctx, claimSQL, args); err != nil {
				b.Fatal(err)
			}
		}
	})
}
