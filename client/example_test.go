package client_test

import (
	"context"
	"log"

	"github.com/zndraw/joblib/client"
)

func Example() {
	ctx := context.Background()
	c, err := client.Dial(ctx, "http://localhost:8000", "jl_...")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(ctx) // deletes the worker
	if _, err := c.RegisterJob(ctx, "demo", "modifiers", "echo", nil); err != nil {
		log.Fatal(err)
	}
	err = c.Run(ctx, func(ctx context.Context, t client.Task) (any, error) {
		return map[string]any{"echo": t.Payload}, nil
	})
	if err != nil {
		log.Fatal(err)
	}
}
