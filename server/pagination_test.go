package server_test

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// gap separates creations so that created_at orders them (test_ordering.py).
const gap = 10 * time.Millisecond

// --- test_ordering.py: every listing is newest first, also across pages.

func TestOrderingNewestFirst(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		carol := e.user("carol", false)
		var workers []string
		for i, n := range []string{"First", "Second", "Third"} {
			if i > 0 {
				time.Sleep(gap)
			}
			tok := []string{e.alice, e.bob, carol}[i]
			workers = append(workers, e.registerJob(tok, "room_1", "modifiers", n)["worker_id"].(string))
		}
		want := []any{"room_1:modifiers:Third", "room_1:modifiers:Second", "room_1:modifiers:First"}
		if got := e.do(e.alice, "GET", api+"/rooms/room_1/jobs", nil).want(200).page().field("full_name"); !slices.Equal(got, want) {
			t.Fatalf("jobs %v, want %v", got, want)
		}
		var paged []any
		for _, off := range []int{0, 2} {
			paged = append(paged, e.do(e.alice, "GET", fmt.Sprintf("%s/rooms/room_1/jobs?limit=2&offset=%d", api, off), nil).want(200).page().field("full_name")...)
		}
		if !slices.Equal(paged, want) {
			t.Fatalf("paged jobs %v, want %v", paged, want)
		}

		newest := []any{workers[2], workers[1], workers[0]}
		if got := e.do(e.alice, "GET", api+"/workers", nil).want(200).page().field("id"); !slices.Equal(got, newest) {
			t.Fatalf("workers %v, want %v", got, newest)
		}
		if got := e.do(e.alice, "GET", api+"/rooms/room_1/workers", nil).want(200).page().field("id"); !slices.Equal(got, newest) {
			t.Fatalf("room workers %v, want %v", got, newest)
		}

		e.seed()
		for i := range 3 {
			if i > 0 {
				time.Sleep(gap)
			}
			e.submit(e.alice, "room_1", rotate, map[string]any{"index": i})
		}
		indices := func(p page) []any {
			var out []any
			for _, it := range p.Items {
				out = append(out, it["payload"].(map[string]any)["index"])
			}
			return out
		}
		wantIdx := []any{2.0, 1.0, 0.0}
		if got := indices(e.do(e.alice, "GET", api+"/rooms/room_1/tasks", nil).want(200).page()); !slices.Equal(got, wantIdx) {
			t.Fatalf("room tasks %v, want %v", got, wantIdx)
		}
		if got := indices(e.do(e.alice, "GET", api+"/rooms/room_1/jobs/"+rotate+"/tasks", nil).want(200).page()); !slices.Equal(got, wantIdx) {
			t.Fatalf("job tasks %v, want %v", got, wantIdx)
		}
		var pagedIdx []any
		for _, off := range []int{0, 2} {
			pagedIdx = append(pagedIdx, indices(e.do(e.alice, "GET", fmt.Sprintf("%s/rooms/room_1/tasks?limit=2&offset=%d", api, off), nil).want(200).page())...)
		}
		if !slices.Equal(pagedIdx, wantIdx) {
			t.Fatalf("paged room tasks %v, want %v", pagedIdx, wantIdx)
		}
	})
}

// FIFO does not depend on timestamps: tasks submitted back to back (equal
// created_at is possible) are claimed in submission order.
func TestClaimOrderWithoutGaps(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		w := e.seed()
		var ids []string
		for range 10 {
			ids = append(ids, e.submit(e.alice, "room", rotate, nil))
		}
		for i, id := range ids {
			if c := e.claim(e.admin, w); c["id"] != id {
				t.Fatalf("claim %d got %v, want %s", i, c["id"], id)
			}
		}
	})
}

// --- test_pagination.py (five @global jobs), applied to every listing.

func TestPagination(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, e *env) {
		for i := range 5 {
			e.registerJob(e.admin, "@global", "modifiers", fmt.Sprintf("Job%d", i))
			e.submit(e.alice, "room", fmt.Sprintf("@global:modifiers:Job%d", i), nil)
		}
		lists := []string{
			api + "/rooms/@global/jobs",
			api + "/workers",
			api + "/rooms/room/workers",
			api + "/rooms/room/tasks",
		}
		for _, base := range lists {
			get := func(q string) page {
				return e.do(e.alice, "GET", base+q, nil).want(200).page()
			}
			p := get("")
			if p.Total != 5 || len(p.Items) != 5 || p.Limit != 50 || p.Offset != 0 {
				t.Fatalf("%s default page %+v", base, p)
			}
			if p = get("?limit=2"); p.Total != 5 || len(p.Items) != 2 || p.Limit != 2 {
				t.Fatalf("%s limit=2: %+v", base, p)
			}
			if p = get("?offset=3"); p.Total != 5 || len(p.Items) != 2 || p.Offset != 3 {
				t.Fatalf("%s offset=3: %+v", base, p)
			}
			if p = get("?limit=2&offset=1"); p.Total != 5 || len(p.Items) != 2 || p.Limit != 2 || p.Offset != 1 {
				t.Fatalf("%s limit=2&offset=1: %+v", base, p)
			}
			if p = get("?offset=100"); p.Total != 5 || len(p.Items) != 0 || p.Offset != 100 {
				t.Fatalf("%s offset=100: %+v", base, p)
			}
			if p = get("?limit=0"); p.Total != 5 || len(p.Items) != 0 || p.Limit != 0 {
				t.Fatalf("%s limit=0: %+v", base, p)
			}
			if p = get("?limit=500"); p.Total != 5 || p.Limit != 500 {
				t.Fatalf("%s limit=500: %+v", base, p)
			}
			// Walking the pages reaches every item once, with a stable total.
			seen := map[string]bool{}
			for off := 0; off < 5; off += 2 {
				p = get(fmt.Sprintf("?limit=2&offset=%d", off))
				if p.Total != 5 {
					t.Fatalf("%s: total %d on page at %d", base, p.Total, off)
				}
				for _, it := range p.Items {
					key := fmt.Sprint(it["id"], it["full_name"])
					if seen[key] {
						t.Fatalf("%s: %s on two pages", base, key)
					}
					seen[key] = true
				}
			}
			if len(seen) != 5 {
				t.Fatalf("%s: %d items reachable, want 5", base, len(seen))
			}
			for _, bad := range []string{"?offset=-1", "?limit=501", "?limit=-1", "?limit=abc", "?offset=1.5"} {
				e.do(e.alice, "GET", base+bad, nil).problem(422, "validation-error")
			}
		}
		// The job task listing paginates the same way.
		p := e.do(e.alice, "GET", api+"/rooms/room/jobs/@global:modifiers:Job0/tasks?limit=0", nil).want(200).page()
		if p.Total != 1 || len(p.Items) != 0 {
			t.Fatalf("job tasks limit=0: %+v", p)
		}
		e.do(e.alice, "GET", api+"/rooms/room/jobs/@global:modifiers:Job0/tasks?limit=501", nil).problem(422, "validation-error")
	})
}
