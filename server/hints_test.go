package server_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/models"
)

// rawJoinedSocket connects as token, joins the job room as worker wid, and
// then never reads again (a worker that is busy or on a slow link).
func rawJoinedSocket(t *testing.T, baseURL, token, job, wid string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(baseURL, "http")+"/socket.io/?EIO=4&transport=websocket", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CloseNow() })
	auth, _ := json.Marshal(map[string]string{"token": token})
	join, _ := json.Marshal([]any{"join_job_room", map[string]string{"job_name": job, "worker_id": wid}})
	for _, send := range []string{"", "40" + string(auth), "421" + string(join)} {
		if send != "" {
			if err := c.Write(ctx, websocket.MessageText, []byte(send)); err != nil {
				t.Fatal(err)
			}
		}
		for {
			_, msg, err := c.Read(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if string(msg) != "2" {
				if strings.HasPrefix(send, "421") && !strings.HasPrefix(string(msg), `431[{"ok":true`) {
					t.Fatalf("join: %q", msg)
				}
				break
			}
		}
	}
	return c
}

// TestSlowWorkerKeepsItsSocketUnderTaskAvailableFlood: task_available is a
// hint. A flood of them to a worker that does not read fills no queue and
// costs the worker nothing: its socket stays bound, and it is not cleaned
// up. The same flood of an ordinary event disconnects a socket that does not
// read as a slow consumer (the control).
func TestSlowWorkerKeepsItsSocketUnderTaskAvailableFlood(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		cfg := realtimeCfg()
		cfg.PingInterval, cfg.PingTimeout = 10*time.Second, 10*time.Second // the sockets do not read during the test
		cfg.SendQueue = 64
		e := setup(t, db, withRealtime(cfg))
		job := e.registerJob(e.alice, "r1", "modifiers", "Rot")
		rawJoinedSocket(t, e.url, e.alice, "r1:modifiers:Rot", job["worker_id"].(string))
		room := events.JobRoom("r1:modifiers:Rot")
		if e.rt.IO().RoomSize(room) != 1 {
			t.Fatal("not joined")
		}
		const flood = 2_000
		ems := make([]events.Emission, flood)
		for i := range ems {
			ems[i] = events.Emission{Room: room, Event: events.TaskAvailable{JobName: "r1:modifiers:Rot", RoomID: "r1", TaskID: strings.Repeat("t", 4000) + strconv.Itoa(i)}}
		}
		if err := e.bus.Publish(context.Background(), ems); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond) // let the writer push what the socket buffers take
		if e.rt.IO().RoomSize(room) != 1 || e.rt.IO().NumSockets() != 1 {
			t.Fatalf("the slow worker's socket was dropped by task_available hints (room %d)", e.rt.IO().RoomSize(room))
		}

		// Control: the same flood of an event that is not a hint.
		for i := range ems {
			ems[i] = events.Emission{Room: room, Event: events.TaskStatusEvent{ID: strings.Repeat("t", 4000) + strconv.Itoa(i), Status: "pending"}}
		}
		if err := e.bus.Publish(context.Background(), ems); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for e.rt.IO().RoomSize(room) != 0 {
			if time.Now().After(deadline) {
				t.Fatal("a socket that does not read survived a flood of ordinary events")
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}
