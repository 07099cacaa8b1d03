// Command claim measures claim throughput over HTTP: W concurrent workers
// each loop claim → running → completed until the queue is empty, against an
// in-process joblib server on loopback. It prints tasks per second and the
// p50/p99 latency of the claim request.
//
//	go run ./bench/claim -db postgres://postgres@127.0.0.1:5432/test -workers 8 -tasks 4000
//	go run ./bench/claim -workers 8 -tasks 4000          # SQLite in a temp dir
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
)

func main() {
	dbURL := flag.String("db", "", "postgres:// URL (a private schema is created and dropped); empty = SQLite in a temp dir")
	workers := flag.Int("workers", 8, "concurrent workers")
	tasks := flag.Int("tasks", 4000, "tasks to process")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the claim phase to this file")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			log.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	if err := run(*dbURL, *workers, *tasks); err != nil {
		log.Print(err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

func run(dbURL string, workers, tasks int) error {
	ctx := context.Background()
	url, cleanup, err := prepare(ctx, dbURL)
	if err != nil {
		return err
	}
	defer cleanup()
	var statements atomic.Int64
	db, err := models.Open(ctx, url, models.OpenOptions{MaxConns: 32, Statements: &statements})
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.Migrate(ctx); err != nil {
		return err
	}
	svc := joblib.New(joblib.Config{DB: db})
	defer svc.Close()
	token, _, err := svc.CreateToken(ctx, "bench", true)
	if err != nil {
		return err
	}
	srv := httptest.NewServer(server.New(svc, server.DefaultConfig(), nil).Handler())
	defer srv.Close()
	c := &client{base: srv.URL + "/v1/joblib", token: token, http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers * 2}}}

	wids := make([]string, workers)
	for i := range wids {
		var job map[string]any
		if err := c.do("PUT", "/rooms/bench/jobs", map[string]any{"category": "modifiers", "name": "Bench"}, &job); err != nil {
			return err
		}
		wids[i] = job["worker_id"].(string)
	}
	var wg sync.WaitGroup
	const submitters = 8
	for s := range submitters {
		wg.Go(func() {
			for i := s; i < tasks; i += submitters {
				if err := c.do("POST", "/rooms/bench/tasks/bench:modifiers:Bench", map[string]any{"payload": map[string]any{"i": i}}, nil); err != nil {
					log.Fatal(err)
				}
			}
		})
	}
	wg.Wait()

	lat := make([][]time.Duration, workers)
	stmts0 := statements.Load()
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			for {
				t0 := time.Now()
				var out struct {
					Task *struct {
						ID string `json:"id"`
					} `json:"task"`
				}
				if err := c.do("POST", "/tasks/claim", map[string]any{"worker_id": wids[w]}, &out); err != nil {
					log.Fatal(err)
				}
				if out.Task == nil {
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
				for _, st := range []string{"running", "completed"} {
					if err := c.do("PATCH", "/tasks/"+out.Task.ID, map[string]any{"status": st}, nil); err != nil {
						log.Fatal(err)
					}
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) != tasks {
		return fmt.Errorf("processed %d tasks, want %d", len(all), tasks)
	}
	perTask := ""
	if db.Dialect() == models.Postgres {
		perTask = fmt.Sprintf(" statements_per_task=%.1f", float64(statements.Load()-stmts0)/float64(tasks))
	}
	fmt.Printf("database=%s workers=%d tasks=%d elapsed=%s throughput=%.0f tasks/s claim_p50=%s claim_p99=%s%s\n",
		db.Dialect(), workers, tasks, elapsed.Round(time.Millisecond), float64(tasks)/elapsed.Seconds(),
		pct(all, 0.50), pct(all, 0.99), perTask)
	return nil
}

func pct(s []time.Duration, p float64) time.Duration {
	return s[min(len(s)-1, int(float64(len(s))*p))].Round(10 * time.Microsecond)
}

// prepare returns a database URL of its own: a temp SQLite file, or a fresh
// schema in the given PostgreSQL.
func prepare(ctx context.Context, dbURL string) (string, func(), error) {
	if dbURL == "" {
		dir, err := os.MkdirTemp("", "joblib-bench-")
		if err != nil {
			return "", nil, err
		}
		return filepath.Join(dir, "bench.db"), func() { os.RemoveAll(dir) }, nil
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return "", nil, err
	}
	schema := fmt.Sprintf("bench_%d", time.Now().UnixNano())
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return "", nil, err
	}
	sep := "?"
	if strings.Contains(dbURL, "?") {
		sep = "&"
	}
	return dbURL + sep + "search_path=" + schema, func() {
		_, _ = conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		conn.Close(ctx)
	}, nil
}

type client struct {
	base, token string
	http        *http.Client
}

func (c *client) do(method, path string, body, out any) error {
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(method, c.base+path, bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	res, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	if res.StatusCode >= 300 {
		return fmt.Errorf("%s %s: %d %s", method, path, res.StatusCode, raw)
	}
	if out != nil {
		return json.Unmarshal(raw, out)
	}
	return nil
}
