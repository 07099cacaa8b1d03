package main

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/zndraw/joblib/internal/sio/sioclient"
	"github.com/zndraw/joblib/internal/sio/wire"
)

// attacks are the rows of the table, in order.
var attacks = []attack{
	{"sio-attachments", attackAttachments},
	{"sio-deep-event", attackDeepEvent},
	{"list-offset", attackListOffset},
	{"provider-results", attackProviderResults},
	{"eio-polling", attackPolling},
	{"ws-no-connect", attackNoConnect},
	{"join-room-loop", attackJoinLoop},
	{"provider-fanout", attackProviderFanout},
	{"internal-flood", attackInternalFlood},
	{"bad-bytes", attackBadBytes},
	{"deep-payload", attackDeepPayload},
	{"metrics-scrape", attackMetrics},
}

// One binary packet announcing 65,536 attachments, then frames just under
// the message size limit until the server closes the connection (or 300
// were sent).
func attackAttachments(ctx context.Context, e *env) string {
	s, err := dialSocket(ctx, e.srv.base(), e.userB, nil, nil)
	if err != nil {
		return "dial: " + err.Error()
	}
	defer s.cl.Kill()
	if err := s.c.Write(ctx, websocket.MessageText, []byte(`4565536-["x",{"_placeholder":true,"num":0}]`)); err != nil {
		return "header refused: " + err.Error()
	}
	frame := make([]byte, 999_000)
	sent := 0
	for ; sent < 300; sent++ {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := s.c.Write(wctx, websocket.MessageBinary, frame)
		cancel()
		if err != nil {
			break
		}
		select {
		case <-s.closed:
			return fmt.Sprintf("closed after %d MB", sent)
		default:
		}
	}
	select {
	case <-s.closed:
		return fmt.Sprintf("closed after %d MB", sent)
	case <-time.After(time.Second):
		return fmt.Sprintf("%d MB accepted", sent)
	}
}

// One ~90 kB binary event nested 9,000 deep (under encoding/json's own
// limit) with its placeholder at the bottom; then the same connection is
// asked for an acknowledgement.
func attackDeepEvent(ctx context.Context, e *env) string {
	s, err := dialSocket(ctx, e.srv.base(), e.userB, nil, nil)
	if err != nil {
		return "dial: " + err.Error()
	}
	defer s.cl.Kill()
	const depth = 9000
	msg := `451-["x",` + strings.Repeat(`{"kkkkk":`, depth) + `{"_placeholder":true,"num":0}` + strings.Repeat("}", depth) + `]`
	start := time.Now()
	if err := s.c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		return "write: " + err.Error()
	}
	if err := s.c.Write(ctx, websocket.MessageBinary, []byte("attachment")); err != nil {
		return "write attachment: " + err.Error()
	}
	if _, err := s.call(ctx, "join_room", map[string]string{"room_id": "after"}); err != nil {
		return fmt.Sprintf("connection closed (%s)", time.Since(start).Round(time.Millisecond))
	}
	return fmt.Sprintf("same connection answered after %s", time.Since(start).Round(time.Millisecond))
}

// A listing deep into the big room's pending tasks.
func attackListOffset(ctx context.Context, e *env) string {
	start := time.Now()
	st, _, err := call("GET", e.srv.base()+"/v1/joblib/rooms/"+e.bigRoom+"/tasks?status=pending&offset=2000", e.userB, nil)
	if err != nil {
		return "error: " + err.Error()
	}
	return fmt.Sprintf("%d after %s", st, time.Since(start).Round(time.Millisecond))
}

// 25 uploads of 16 MB to distinct request hashes of one provider.
func attackProviderResults(ctx context.Context, e *env) string {
	st, body, err := call("PUT", e.srv.base()+"/v1/joblib/rooms/uploads/providers", e.userA,
		mustJSON(map[string]any{"category": "filesystem", "name": "big", "schema": map[string]any{}}))
	if err != nil || st/100 != 2 {
		return fmt.Sprintf("register provider: %d %s", st, body)
	}
	id := jsonField(body, "id")
	payload := make([]byte, 16<<20-1)
	var codes []int
	for range 25 {
		st, _, err := call("POST", e.srv.base()+"/v1/joblib/providers/"+id+"/results", e.userA, payload, "X-Request-Hash: "+randomHash())
		if err != nil {
			st = -1
		}
		codes = append(codes, st)
	}
	return statusCounts(codes)
}

// 2,000 Engine.IO polling handshakes with 32 KiB of headers that never
// upgrade nor poll again.
func attackPolling(ctx context.Context, e *env) string {
	pad := strings.Repeat("p", 32<<10)
	var mu sync.Mutex
	var codes []int
	var wg sync.WaitGroup
	sem := make(chan struct{}, 50)
	for range 2000 {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			st, _, err := call("GET", e.srv.base()+"/socket.io/?EIO=4&transport=polling", "", nil, "X-Pad: "+pad)
			if err != nil {
				st = -1
			}
			mu.Lock()
			codes = append(codes, st)
			mu.Unlock()
		})
	}
	wg.Wait()
	return statusCounts(codes)
}

// 1,000 websocket sessions with 128 KiB of headers that never send a
// Socket.IO CONNECT, held open for 3 s.
func attackNoConnect(ctx context.Context, e *env) string {
	h := http.Header{}
	h.Set("X-Pad", strings.Repeat("h", 128<<10))
	url := "ws" + strings.TrimPrefix(e.srv.base(), "http") + "/socket.io/?EIO=4&transport=websocket"
	var conns []*websocket.Conn
	var mu sync.Mutex
	var failed atomic.Int32
	var wg sync.WaitGroup
	sem := make(chan struct{}, 50)
	for range 1000 {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: h})
			if err == nil {
				var open []byte
				if _, open, err = c.Read(ctx); err == nil {
					if p, perr := wire.DecodeEIO(open); perr != nil || p.Type != wire.EIOOpen {
						err = fmt.Errorf("engine.io open: %.40q", open)
					}
				}
				if err != nil {
					c.CloseNow()
				}
			}
			if err != nil {
				failed.Add(1)
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		})
	}
	wg.Wait()
	time.Sleep(3 * time.Second)
	for _, c := range conns {
		c.CloseNow()
	}
	return fmt.Sprintf("%d opened, %d refused", len(conns), failed.Load())
}

// join_room 20,000 times on one socket, acknowledgements drained.
func attackJoinLoop(ctx context.Context, e *env) string {
	s, err := dialSocket(ctx, e.srv.base(), e.userB, nil, nil)
	if err != nil {
		return "dial: " + err.Error()
	}
	defer s.cl.Kill()
	ok, refused := 0, 0
	const n, window = 20480, 256
	for start := 0; start < n; start += window {
		chans := make([]<-chan sioclient.Ack, 0, window)
		for i := start; i < start+window; i++ {
			ch, err := s.emit(ctx, "join_room", map[string]string{"room_id": "r" + strconv.Itoa(i)})
			if err != nil {
				return fmt.Sprintf("%d joined, %d refused, then write failed", ok, refused)
			}
			chans = append(chans, ch)
		}
		for _, ch := range chans {
			select {
			case a := <-ch:
				if ackOK(a) {
					ok++
				} else {
					refused++
				}
			case <-s.closed:
				return fmt.Sprintf("%d joined, %d refused, then closed", ok, refused)
			case <-ctx.Done():
				return fmt.Sprintf("%d joined, %d refused, then timed out", ok, refused)
			}
		}
	}
	return fmt.Sprintf("%d joined, %d refused", ok, refused)
}

// User B reads user A's provider with 2,000 distinct params (100 at a
// time) while A's worker socket serves it; then: is A's provider alive?
func attackProviderFanout(ctx context.Context, e *env) string {
	st, body, err := call("POST", e.srv.base()+"/v1/joblib/workers", e.userA, nil)
	if err != nil || st != 201 {
		return fmt.Sprintf("worker: %d %s", st, body)
	}
	wid := jsonField(body, "id")
	st, body, err = call("PUT", e.srv.base()+"/v1/joblib/rooms/fan/providers", e.userA,
		mustJSON(map[string]any{"category": "filesystem", "name": "shared", "schema": map[string]any{}, "worker_id": wid}))
	if err != nil || st/100 != 2 {
		return fmt.Sprintf("register provider: %d %s", st, body)
	}
	var requests atomic.Int32
	s, err := dialSocket(ctx, e.srv.base(), e.userA, nil, func(ev sioclient.Event) {
		if ev.Name == "provider_request" {
			requests.Add(1)
		}
	})
	if err != nil {
		return "dial: " + err.Error()
	}
	defer s.cl.Kill()
	if a, err := s.call(ctx, "join_provider_room", map[string]string{"provider_name": "fan:filesystem:shared", "worker_id": wid}); err != nil || !ackOK(a) {
		return fmt.Sprintf("join provider room: %s %v", a.Args, err)
	}
	var mu sync.Mutex
	var codes []int
	var wg sync.WaitGroup
	sem := make(chan struct{}, 100)
	for i := range 2000 {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			st, _, err := call("GET", e.srv.base()+"/v1/joblib/rooms/fan/providers/fan:filesystem:shared?i="+strconv.Itoa(i), e.userB, nil, "Prefer: wait=0")
			if err != nil {
				st = -1
			}
			mu.Lock()
			codes = append(codes, st)
			mu.Unlock()
		})
	}
	wg.Wait()
	time.Sleep(time.Second)
	alive := "socket open"
	select {
	case <-s.closed:
		alive = "socket closed"
	default:
	}
	st, _, _ = call("GET", e.srv.base()+"/v1/joblib/rooms/fan/providers/fan:filesystem:shared/info", e.userA, nil)
	return fmt.Sprintf("%s; %d requests reached A; A's %s, provider info %d", statusCounts(codes), requests.Load(), alive, st)
}

// 600 RoomSummary submissions from one user, 32 at a time, on the big
// room; then another user's submission.
func attackInternalFlood(ctx context.Context, e *env) string {
	url := e.srv.base() + "/v1/joblib/rooms/" + e.bigRoom + "/tasks/@internal:analysis:RoomSummary"
	var accepted, dispatchFailed, limited, other atomic.Int32
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for range 600 {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			st, body, err := call("POST", url, e.userB, []byte(`{"payload":{}}`))
			switch {
			case err != nil:
				other.Add(1)
			case st == 202 && strings.Contains(string(body), "Failed to dispatch"):
				dispatchFailed.Add(1)
			case st == 202:
				accepted.Add(1)
			case st == 429:
				limited.Add(1)
			default:
				other.Add(1)
			}
		})
	}
	// Another user submits while the flood is queued.
	time.Sleep(200 * time.Millisecond)
	st, body, _ := call("POST", url, e.userA, []byte(`{"payload":{}}`))
	bystander := "other user's submission accepted"
	switch {
	case st == 202 && strings.Contains(string(body), "Failed to dispatch"):
		bystander = "other user's submission FAILED to dispatch"
	case st != 202:
		bystander = fmt.Sprintf("other user's submission: %d", st)
	}
	wg.Wait()
	return fmt.Sprintf("%d accepted, %d failed to dispatch, %d×429, %d other; %s", accepted.Load(), dispatchFailed.Load(), limited.Load(), other.Load(), bystander)
}

// Invalid UTF-8 in a payload, and max_attempts out of range.
func attackBadBytes(ctx context.Context, e *env) string {
	st1, _, _ := call("POST", e.srv.base()+"/v1/joblib/rooms/bad/tasks/"+e.bigJob, e.userB, []byte("{\"payload\":{\"x\":\"\xff\xfe\"}}"))
	st2, _, _ := call("PUT", e.srv.base()+"/v1/joblib/rooms/bad/jobs", e.userB,
		[]byte(`{"category":"modifiers","name":"Bad","schema":{},"on_worker_loss":"requeue","max_attempts":3000000000}`))
	st3, _, _ := call("POST", e.srv.base()+"/v1/joblib/rooms/bad/tasks/"+e.bigJob, e.userB, []byte(`{"payload":{"x":"a\u0000b"}}`))
	return fmt.Sprintf("invalid UTF-8 %d, max_attempts 3e9 %d, NUL %d", st1, st2, st3)
}

// A payload nested 9,999 levels deep (the most encoding/json decodes); is
// it stored?
func attackDeepPayload(ctx context.Context, e *env) string {
	const depth = 9997
	body := `{"payload":` + strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth) + `}`
	st, _, _ := call("POST", e.srv.base()+"/v1/joblib/rooms/deep/tasks/"+e.bigJob, e.userB, []byte(body))
	return fmt.Sprintf("%d", st)
}

// 20 scrapes of /metrics with the seeded tasks in the table.
func attackMetrics(ctx context.Context, e *env) string {
	var took []time.Duration
	st := 0
	for range 20 {
		start := time.Now()
		st, _, _ = call("GET", e.srv.base()+"/metrics", "", nil)
		took = append(took, time.Since(start))
	}
	return fmt.Sprintf("%d; first scrape %s, median %s (unauthenticated)", st, ms(took[0]), ms(p50(took)))
}

func jsonField(body []byte, name string) string {
	var m map[string]any
	_ = jsonUnmarshal(body, &m)
	s, _ := m[name].(string)
	return s
}
