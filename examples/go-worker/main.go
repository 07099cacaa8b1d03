// Command go-worker is a joblib worker written with the Go SDK: it serves the
// job <room>:modifiers:echo, answering each task with its payload, and the
// provider <room>:files:echo, answering each read with its parameters, until
// interrupted, then deletes its worker. It prints "ready <worker id>" once
// serving and "stopped" after deleting its worker.
//
//	go run ./examples/go-worker -url http://localhost:8080 -token jl_... -room demo
//
// JOBLIB_CLIENT_URL and JOBLIB_CLIENT_TOKEN (or JOBLIB_URL and JOBLIB_TOKEN)
// are read when the flags are not given; the URL defaults to the server's
// default address.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/zndraw/joblib/client"
)

func main() {
	url := flag.String("url", envOr("http://localhost:8080", "JOBLIB_CLIENT_URL", "JOBLIB_URL"), "joblib server URL")
	token := flag.String("token", envOr("", "JOBLIB_CLIENT_TOKEN", "JOBLIB_TOKEN"), "API token (jl_...)")
	room := flag.String("room", "demo", "room of the job")
	flag.Parse()
	if err := run(*url, *token, *room); err != nil {
		log.Fatal(err)
	}
}

func run(url, token, room string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c, err := client.Dial(ctx, url, token)
	if err != nil {
		return err
	}
	job, err := c.RegisterJob(ctx, room, "modifiers", "echo", map[string]any{"type": "object"})
	if err != nil {
		return err
	}
	prov, err := c.RegisterProvider(ctx, client.ProviderSpec{Room: room, Category: "files", Name: "echo"},
		func(ctx context.Context, params map[string]string) ([]byte, error) {
			return json.Marshal(map[string]any{"params": params})
		})
	if err != nil {
		return err
	}
	log.Printf("serving %s", prov.FullName)
	fmt.Printf("ready %s\n", c.WorkerID()) // the worker id; it serves job.FullName
	log.Printf("serving %s", job.FullName)
	runErr := c.Run(ctx, func(ctx context.Context, t client.Task) (any, error) {
		var payload map[string]any
		if err := json.Unmarshal(t.Payload, &payload); err != nil {
			return nil, fmt.Errorf("decode payload: %w", err)
		}
		log.Printf("task %s", t.ID)
		return map[string]any{"echo": payload}, nil
	})
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Close(cctx); err != nil {
		return err
	}
	fmt.Println("stopped")
	return runErr
}

// envOr returns the first of the variables that is set, else def.
func envOr(def string, keys ...string) string {
	for _, k := range keys {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	return def
}
