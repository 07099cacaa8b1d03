package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// Two real `joblib serve` processes on one PostgreSQL: a provider read
// long-polling on one is woken by the result uploaded through the other.
func TestServeTwoNodesProviderWake(t *testing.T) {
	t.Parallel()
	dbURL := dbtest.URL(t, models.Postgres)
	token := "jl_e2e_" + uuid.NewString()
	env := []string{"JOBLIB_DATABASE_URL=" + dbURL, "JOBLIB_ADMIN_TOKEN=" + token}
	a := startServe(t, env...)
	b := startServe(t, env...) // after a: a owns the first migration and the admin user

	st, body, _ := callRaw(t, "PUT", a.base()+"/rooms/@global/providers", token, []byte(`{"category":"filesystem","name":"local"}`))
	if st != 201 {
		t.Fatalf("register: %d %s", st, body)
	}
	var prov struct{ ID uuid.UUID }
	if err := json.Unmarshal(body, &prov); err != nil {
		t.Fatal(err)
	}
	params := map[string]string{"path": "/data"}
	hash := joblib.RequestHash(params)

	type answer struct {
		status int
		body   string
		at     time.Time
	}
	got := make(chan answer, 1)
	go func() {
		st, body, _ := callRaw(t, "GET", a.base()+"/rooms/room-1/providers/@global:filesystem:local?path=/data", token, nil, "Prefer: wait=20")
		got <- answer{st, string(body), time.Now()}
	}()
	// The read has dispatched once its inflight lock exists; it then waits.
	db, err := models.Open(t.Context(), dbURL, models.OpenOptions{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		held, err := db.InflightHeld(t.Context(), models.ResultKey{ProviderID: prov.ID, Hash: hash})
		if err != nil {
			t.Fatal(err)
		}
		if held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the read on node a never dispatched")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // let the reader settle into its wait
	uploaded := time.Now()
	st, body, _ = callRaw(t, "POST", b.base()+"/providers/"+prov.ID.String()+"/results", token, []byte(`{"files":["a.xyz"]}`), "X-Request-Hash: "+hash)
	if st != 204 {
		t.Fatalf("upload on b: %d %s", st, body)
	}
	select {
	case r := <-got:
		if r.status != 200 || r.body != `{"files":["a.xyz"]}` {
			t.Fatalf("read on a: %d %s", r.status, r.body)
		}
		if d := r.at.Sub(uploaded); d > 3*time.Second {
			t.Fatalf("node a answered %s after the upload on node b (a 20 s wait: no wake-up)", d)
		}
	case <-time.After(25 * time.Second):
		t.Fatal("the read on node a never returned")
	}
}
