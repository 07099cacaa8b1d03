package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// node is one `joblib serve` process.
type node struct {
	cmd  *exec.Cmd
	base string
}

func startNode(t *testing.T, bin, dbURL, token string) *node {
	t.Helper()
	cmd := exec.Command(bin, "serve")
	cmd.Env = append(os.Environ(),
		"JOBLIB_DATABASE_URL="+dbURL, "JOBLIB_LISTEN_ADDR=127.0.0.1:0", "JOBLIB_ADMIN_TOKEN="+token,
		"JOBLIB_LOG_FORMAT=json", "JOBLIB_SHUTDOWN_TIMEOUT=5s")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n := &node{cmd: cmd}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("joblib serve exited with %v", err)
			}
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			t.Error("joblib serve did not stop on SIGTERM")
		}
	})
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var l struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == "listening" {
				addr <- l.Addr
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	select {
	case a := <-addr:
		n.base = "http://" + a + "/v1/joblib"
	case <-time.After(60 * time.Second):
		t.Fatal("joblib serve did not start listening")
	}
	return n
}

func call(t *testing.T, method, url, token string, body []byte, hdr ...string) (int, []byte, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(method, url, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	for _, h := range hdr {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(k, strings.TrimSpace(v))
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b, res.Header
}

// Two real `joblib serve` processes on one PostgreSQL: a provider read
// long-polling on one is woken by the result uploaded through the other.
func TestServeTwoNodesProviderWake(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "joblib")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dbURL := dbtest.URL(t, models.Postgres)
	token := "jl_e2e_" + uuid.NewString()
	a := startNode(t, bin, dbURL, token)
	b := startNode(t, bin, dbURL, token) // after a: a owns the first migration and the admin user

	st, body, _ := call(t, "PUT", a.base+"/rooms/@global/providers", token, []byte(`{"category":"filesystem","name":"local"}`))
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
		st, body, _ := call(t, "GET", a.base+"/rooms/room-1/providers/@global:filesystem:local?path=/data", token, nil, "Prefer: wait=20")
		got <- answer{st, string(body), time.Now()}
	}()
	// The read has dispatched once its inflight lock exists; it then waits.
	db, err := models.Open(t.Context(), dbURL, models.OpenOptions{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	cache, err := models.NewPGResultCache(db, models.PGResultCacheConfig{})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		held, err := cache.Inflight(t.Context(), models.ResultKey{ProviderID: prov.ID, Hash: hash})
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
	st, body, _ = call(t, "POST", b.base+"/providers/"+prov.ID.String()+"/results", token, []byte(`{"files":["a.xyz"]}`), "X-Request-Hash: "+hash)
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
