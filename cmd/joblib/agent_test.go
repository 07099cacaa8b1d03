package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// agent drives many real socket.io-client sockets in one Node.js process
// (server/testdata/node/agent.mjs) and records everything they receive.
type agent struct {
	t     *testing.T
	stdin io.WriteCloser

	mu      sync.Mutex
	cond    *sync.Cond
	next    int
	replies map[int]agentReply
	events  []agentEvent
	dead    error
}

type agentReply struct {
	OK     bool            `json:"ok"`
	Result json.RawMessage `json:"result"`
	Error  string          `json:"error"`
}

// agentEvent is one event a socket received ("$disconnect" when it closed).
type agentEvent struct {
	Sock    string          `json:"sock"`
	Event   string          `json:"event"`
	Payload json.RawMessage `json:"payload"`
	Reason  string          `json:"reason"`
	At      time.Time       `json:"-"`
}

func (e agentEvent) field(k string) string {
	var m map[string]any
	_ = json.Unmarshal(e.Payload, &m)
	s, _ := m[k].(string)
	return s
}

func startAgent(t *testing.T) *agent {
	t.Helper()
	dir, _ := filepath.Abs("../../server/testdata/node")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "socket.io-client")); err != nil {
		t.Fatal("socket.io-client is not installed; run: npm ci --prefix server/testdata/node (scripts/test.sh does this)")
	}
	cmd := exec.Command("node", filepath.Join(dir, "agent.mjs"))
	cmd.Dir = dir
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a := &agent{t: t, stdin: stdin, replies: map[int]agentReply{}}
	a.cond = sync.NewCond(&a.mu)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		for sc.Scan() {
			var line struct {
				Req *int `json:"req"`
				agentReply
				agentEvent
			}
			if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
				continue
			}
			a.mu.Lock()
			if line.Req != nil {
				a.replies[*line.Req] = line.agentReply
			} else {
				ev := line.agentEvent
				ev.At = time.Now()
				a.events = append(a.events, ev)
			}
			a.cond.Broadcast()
			a.mu.Unlock()
		}
		a.mu.Lock()
		a.dead = fmt.Errorf("agent exited")
		a.cond.Broadcast()
		a.mu.Unlock()
	}()
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	return a
}

// do sends a command and waits for its reply.
func (a *agent) do(cmd map[string]any) (json.RawMessage, error) {
	a.mu.Lock()
	a.next++
	id := a.next
	a.mu.Unlock()
	cmd["req"] = id
	line, _ := json.Marshal(cmd)
	if _, err := a.stdin.Write(append(line, '\n')); err != nil {
		return nil, err
	}
	deadline := time.AfterFunc(15*time.Second, func() { a.mu.Lock(); a.cond.Broadcast(); a.mu.Unlock() })
	defer deadline.Stop()
	start := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	for {
		if r, ok := a.replies[id]; ok {
			delete(a.replies, id)
			if !r.OK {
				return nil, fmt.Errorf("agent %v: %s", cmd["op"], r.Error)
			}
			return r.Result, nil
		}
		if a.dead != nil {
			return nil, a.dead
		}
		if time.Since(start) > 15*time.Second {
			return nil, fmt.Errorf("agent %v: no reply", cmd["op"])
		}
		a.cond.Wait()
	}
}

func (a *agent) connect(sock, url, token string, transports ...string) {
	a.t.Helper()
	cmd := map[string]any{"op": "connect", "sock": sock, "url": url, "token": token}
	if len(transports) > 0 {
		cmd["transports"] = transports
	}
	if _, err := a.do(cmd); err != nil {
		a.t.Fatalf("connect %s to %s: %v", sock, url, err)
	}
}

// emit sends an event with an ack and requires {"ok": true}.
func (a *agent) emit(sock, event string, payload any) {
	a.t.Helper()
	res, err := a.do(map[string]any{"op": "emit", "sock": sock, "event": event, "payload": payload})
	if err != nil {
		a.t.Fatalf("%s %s: %v", sock, event, err)
	}
	var ack struct{ OK bool }
	if json.Unmarshal(res, &ack) != nil || !ack.OK {
		a.t.Fatalf("%s %s: ack %s", sock, event, res)
	}
}

// waitFor waits until a received event satisfies pred and returns it.
func (a *agent) waitFor(what string, timeout time.Duration, pred func(agentEvent) bool) agentEvent {
	a.t.Helper()
	deadline := time.Now().Add(timeout)
	wake := time.AfterFunc(timeout, func() { a.mu.Lock(); a.cond.Broadcast(); a.mu.Unlock() })
	defer wake.Stop()
	a.mu.Lock()
	defer a.mu.Unlock()
	seen := 0
	for {
		for ; seen < len(a.events); seen++ {
			if pred(a.events[seen]) {
				return a.events[seen]
			}
		}
		if time.Now().After(deadline) || a.dead != nil {
			a.t.Fatalf("timed out after %s waiting for %s; the sockets' last events:\n%s", timeout, what, a.lastEvents(40))
		}
		a.cond.Wait()
	}
}

// lastEvents formats the last n events the sockets received, oldest
// first, for a failure message. The caller holds a.mu.
func (a *agent) lastEvents(n int) string {
	var b strings.Builder
	for _, e := range a.events[max(0, len(a.events)-n):] {
		payload := string(e.Payload)
		if len(payload) > 160 {
			payload = payload[:160] + "…"
		}
		fmt.Fprintf(&b, "  %s %s %s %s %s\n", e.At.Format("15:04:05.000"), e.Sock, e.Event, e.Reason, payload)
	}
	return b.String()
}

// received returns the events a socket received so far.
func (a *agent) received(sock string) []agentEvent {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []agentEvent
	for _, e := range a.events {
		if e.Sock == sock {
			out = append(out, e)
		}
	}
	return out
}

// emitN sends n acknowledged events one after the other and returns the
// milliseconds they took.
func (a *agent) emitN(sock, event string, payload any, n int) float64 {
	a.t.Helper()
	res, err := a.do(map[string]any{"op": "emitn", "sock": sock, "event": event, "payload": payload, "n": n})
	if err != nil {
		a.t.Fatalf("%s %d x %s: %v", sock, n, event, err)
	}
	var ms float64
	_ = json.Unmarshal(res, &ms)
	return ms
}

// transport is the Engine.IO transport a socket uses now.
func (a *agent) transport(sock string) string {
	a.t.Helper()
	res, err := a.do(map[string]any{"op": "transport", "sock": sock})
	if err != nil {
		a.t.Fatal(err)
	}
	var tr string
	_ = json.Unmarshal(res, &tr)
	return tr
}

func (a *agent) close(sock string) {
	a.t.Helper()
	if _, err := a.do(map[string]any{"op": "close", "sock": sock}); err != nil {
		a.t.Fatal(err)
	}
}
