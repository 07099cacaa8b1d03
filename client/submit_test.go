package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// A submission that meets a 429 waits for its Retry-After, one whose answer
// was lost (the connection dropped) waits a backoff, and every attempt
// carries the same Idempotency-Key, so the server creates the task once.
func TestSubmitRetriesWithOneKey(t *testing.T) {
	t.Parallel()
	var (
		mu   sync.Mutex
		keys []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			fmt.Fprint(w, `{"items":[],"total":0}`)
			return
		}
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		n := len(keys)
		mu.Unlock()
		switch n {
		case 1:
			// A fresh connection for the next attempt: net/http retries a
			// request with an Idempotency-Key by itself on a reused one.
			w.Header().Set("Connection", "close")
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Retry-After", "3")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, `{"type":"/v1/problems/rate-limited","title":"Too Many Requests","status":429}`)
		case 2:
			// The request arrived, the answer is lost.
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		default:
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(http.StatusAccepted)
			fmt.Fprint(w, `{"id":"t1","job_name":"@global:modifiers:J","room_id":"r","status":"pending","payload":{"a":1}}`)
		}
	}))
	defer srv.Close()
	c, err := Dial(context.Background(), srv.URL, "tok")
	if err != nil {
		t.Fatal(err)
	}
	var slept []time.Duration
	c.sleep = func(_ context.Context, d time.Duration) error { slept = append(slept, d); return nil }
	task, replayed, err := c.Submit(context.Background(), "r", "@global:modifiers:J", map[string]any{"a": 1})
	if err != nil {
		t.Fatal(err)
	}
	if task.ID != "t1" || !replayed {
		t.Fatalf("task %+v replayed %v", task, replayed)
	}
	if len(keys) != 3 || keys[0] == "" || keys[1] != keys[0] || keys[2] != keys[0] {
		t.Fatalf("keys %q: want one non-empty key on every attempt", keys)
	}
	if len(slept) != 2 || slept[0] != 3*time.Second || slept[1] <= 0 || slept[1] > 2*time.Second {
		t.Fatalf("waits %v: want the Retry-After (3s), then a short backoff", slept)
	}

	// A 4xx other than 429 is final: sent once.
	keys = nil
	srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		w.WriteHeader(http.StatusUnprocessableEntity)
		fmt.Fprint(w, `{"type":"/v1/problems/idempotency-key-reused","status":422}`)
	})
	if _, _, err := c.Submit(context.Background(), "r", "@global:modifiers:J", nil, WithIdempotencyKey("k")); err == nil || len(keys) != 1 || keys[0] != "k" {
		t.Fatalf("422: err %v after %d attempts (keys %q)", err, len(keys), keys)
	}
}

// Against a real server: a repeated Submit with one key gets the first
// task (replayed), and a batch comes back in order and replays whole.
func TestSubmitIdempotentAndBatch(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		ts := startServer(t, db, 5*time.Second)
		c := dial(t, ts)
		ctx := context.Background()
		if _, err := c.RegisterJob(ctx, "room", "modifiers", "Sub", nil); err != nil {
			t.Fatal(err)
		}
		job := "room:modifiers:Sub"
		a, r1, err := c.Submit(ctx, "room", job, map[string]any{"n": 1}, WithIdempotencyKey("once"))
		if err != nil {
			t.Fatal(err)
		}
		b, r2, err := c.Submit(ctx, "room", job, map[string]any{"n": 1}, WithIdempotencyKey("once"))
		if err != nil {
			t.Fatal(err)
		}
		if r1 || !r2 || a.ID != b.ID {
			t.Fatalf("first %s (replayed %v), repeat %s (replayed %v): want one task, the repeat replayed", a.ID, r1, b.ID, r2)
		}
		ps := []any{map[string]any{"i": 0}, map[string]any{"i": 1}, map[string]any{"i": 2}}
		s1, err := c.SubmitBatch(ctx, "room", job, ps, WithIdempotencyKey("batch"))
		if err != nil {
			t.Fatal(err)
		}
		s2, err := c.SubmitBatch(ctx, "room", job, ps, WithIdempotencyKey("batch"))
		if err != nil {
			t.Fatal(err)
		}
		if len(s1.Tasks) != 3 || s1.Replayed || !s2.Replayed || len(s2.Tasks) != 3 {
			t.Fatalf("batch %+v, repeat %+v", s1, s2)
		}
		for i, tk := range s1.Tasks {
			var p struct{ I int }
			if err := json.Unmarshal(tk.Payload, &p); err != nil || p.I != i || s2.Tasks[i].ID != tk.ID {
				t.Fatalf("task %d: payload %s, replayed id %s vs %s", i, tk.Payload, s2.Tasks[i].ID, tk.ID)
			}
		}
	})
}
