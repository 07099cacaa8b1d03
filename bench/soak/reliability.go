package main

// The reliability measurements (-measure): how fast each cleanup path
// detects a dead worker, how often a live worker is wrongly reaped under
// full CPU load, and how long after a worker's SIGKILL a UI sees its task
// fail. Each runs against the same child `joblib serve` as the soak.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/client"
	"github.com/zndraw/joblib/models"
)

// ---- detection latency per cleanup path ----

// measureDetection kills -n workers per cleanup path in a scripted way and
// reports, per path, the detection latency as the server's histogram
// (joblib_worker_detection_latency_seconds: cleanup minus last heartbeat,
// both on the database's clock) gives it, the same figure exactly from the
// cleanup evidence, and the time from the worker's death to its cleanup.
//
//   - startup: socket workers whose server is SIGKILLed and restarted with
//     the same JOBLIB_NODE_ID; they never come back;
//   - graceful: REST workers that heartbeat, wait up to 1 s and delete
//     themselves;
//   - disconnect: socket workers whose connection is dropped without a word;
//   - sweeper: REST workers that stop heartbeating, spread over one sweep
//     interval.
func (h *harness) measureDetection(ctx context.Context) error {
	o := h.o
	fmt.Fprintf(h.out, "detection: %s on %s, %d workers per path; worker timeout %s, sweeper interval %s, disconnect grace %s\n",
		o.bin, o.db, o.n, o.workerTimeout, o.sweepInterval, o.grace)
	var mu sync.Mutex
	died := map[uuid.UUID]time.Time{}
	dead := func(wid string, at time.Time) {
		mu.Lock()
		died[uuid.MustParse(wid)] = at
		mu.Unlock()
	}

	// startup: bound sockets, then the server dies with them.
	var socks []*sioClient
	var ids []string
	for range o.n {
		wid, s, err := h.boundWorker(ctx)
		if err != nil {
			return fmt.Errorf("startup wave: %w", err)
		}
		socks, ids = append(socks, s), append(ids, wid)
	}
	h.killServer()
	at := time.Now()
	for i, s := range socks {
		s.close()
		dead(ids[i], at)
	}
	if err := h.startServer(ctx); err != nil {
		return fmt.Errorf("restart: %w", err)
	}

	var wg sync.WaitGroup
	errs := make(chan error, 3*o.n)
	for range o.n {
		wg.Go(func() { // graceful
			wid, err := h.register(ctx)
			if err != nil {
				errs <- err
				return
			}
			time.Sleep(time.Duration(rand.Int64N(int64(time.Second))))
			dead(wid, time.Now())
			if code, err := h.call(ctx, "DELETE", "/workers/"+wid, nil, nil); err != nil || code != 204 {
				errs <- fmt.Errorf("delete worker: %d %v", code, err)
			}
		})
		wg.Go(func() { // disconnect
			wid, s, err := h.boundWorker(ctx)
			if err != nil {
				errs <- err
				return
			}
			time.Sleep(time.Duration(rand.Int64N(int64(time.Second))))
			s.close()
			dead(wid, time.Now())
		})
		wg.Go(func() { // sweeper: registered (a heartbeat), then silent
			// Spread over one sweep interval, so that the deaths fall at
			// every phase of the sweeper's period, not all at one.
			time.Sleep(time.Duration(rand.Int64N(int64(o.sweepInterval))))
			wid, err := h.register(ctx)
			if err != nil {
				errs <- err
				return
			}
			dead(wid, time.Now())
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	deadline := time.Now().Add(o.workerTimeout + o.sweepInterval + o.grace + time.Minute)
	for {
		m, err := h.metrics(ctx)
		if err == nil && m["joblib_workers"] == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("workers left after %s: %v", time.Until(deadline), m["joblib_workers"])
		}
		time.Sleep(250 * time.Millisecond)
	}
	m, err := h.metrics(ctx)
	if err != nil {
		return err
	}
	evs, err := h.db.Q(ctx).ListCleanupEvents(models.CleanupEventFilter{}, 100_000)
	if err != nil {
		return err
	}
	sinceBeat := map[string][]float64{}
	sinceDeath := map[string][]float64{}
	for _, e := range evs {
		if e.Shadow || !e.LastHeartbeat.Valid() {
			continue
		}
		sinceBeat[e.Path] = append(sinceBeat[e.Path], e.DBNow.Sub(e.LastHeartbeat.Time).Seconds())
		if d, ok := died[e.WorkerID]; ok {
			sinceDeath[e.Path] = append(sinceDeath[e.Path], e.DBNow.Sub(d).Seconds())
		}
	}
	fmt.Fprintln(h.out, "\n| path | workers | histogram p50 / p99 | exact p50 / p99 (cleanup − last heartbeat) | death → cleanup p50 / p99 |")
	fmt.Fprintln(h.out, "| --- | --- | --- | --- | --- |")
	for _, path := range []string{"graceful", "disconnect", "sweeper", "startup"} {
		b := buckets(m, "joblib_worker_detection_latency_seconds_bucket", path)
		fmt.Fprintf(h.out, "| %s | %d | %s / %s s | %s / %s s | %s / %s s |\n", path, len(sinceBeat[path]),
			secs(histQuantile(0.5, b)), secs(histQuantile(0.99, b)),
			secs(quantile(sinceBeat[path], 0.5)), secs(quantile(sinceBeat[path], 0.99)),
			secs(quantile(sinceDeath[path], 0.5)), secs(quantile(sinceDeath[path], 0.99)))
	}
	for _, path := range []string{"graceful", "disconnect", "sweeper", "startup"} {
		if len(sinceBeat[path]) != o.n {
			return fmt.Errorf("%d %s cleanups recorded, want %d", len(sinceBeat[path]), path, o.n)
		}
	}
	return nil
}

// boundWorker registers a worker and binds it to a Socket.IO connection.
func (h *harness) boundWorker(ctx context.Context) (string, *sioClient, error) {
	wid, err := h.register(ctx)
	if err != nil {
		return "", nil, err
	}
	s, err := dialSIO(ctx, h.base, h.token, func(string, json.RawMessage) {})
	if err != nil {
		return "", nil, err
	}
	if err := s.emitOK(ctx, "join_job_room", map[string]any{"job_name": jobName, "worker_id": wid}); err != nil {
		s.close()
		return "", nil, err
	}
	return wid, s, nil
}

type bucket struct{ le, count float64 }

// buckets reads one label's cumulative histogram buckets from a scrape.
func buckets(m map[string]float64, name, path string) []bucket {
	var bs []bucket
	for k, v := range m {
		if !strings.HasPrefix(k, name+"{") || !strings.Contains(k, `path="`+path+`"`) {
			continue
		}
		i := strings.Index(k, `le="`)
		if i < 0 {
			continue
		}
		rest := k[i+4:]
		j := strings.IndexByte(rest, '"')
		if j < 0 {
			continue
		}
		le, err := strconv.ParseFloat(rest[:j], 64) // "+Inf" included
		if err != nil {
			continue
		}
		bs = append(bs, bucket{le, v})
	}
	slices.SortFunc(bs, func(a, b bucket) int { return cmpFloat(a.le, b.le) })
	return bs
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// histQuantile estimates a quantile from cumulative buckets the way
// Prometheus's histogram_quantile does: linear within the bucket that holds
// the rank; the largest finite bound when the rank is in +Inf.
func histQuantile(q float64, bs []bucket) float64 {
	if len(bs) == 0 || bs[len(bs)-1].count == 0 {
		return math.NaN()
	}
	rank := q * bs[len(bs)-1].count
	lower, below := 0.0, 0.0
	for i, b := range bs {
		if b.count >= rank {
			if math.IsInf(b.le, 1) {
				if i > 0 {
					return bs[i-1].le
				}
				return math.NaN()
			}
			if b.count == below {
				return b.le
			}
			return lower + (b.le-lower)*(rank-below)/(b.count-below)
		}
		lower, below = b.le, b.count
	}
	return math.NaN()
}

// quantile is the nearest-rank quantile of xs.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(i, 0)]
}

func secs(x float64) string {
	if math.IsNaN(x) {
		return "—"
	}
	return strconv.FormatFloat(x, 'f', 2, 64)
}

// ---- false positives under load ----

// measureFalsePositives keeps -socket-workers + -rest-workers live workers
// busy with -rate tasks per second for -duration, with stress-ng loading
// every CPU beside the server, and counts the live workers the server
// reaped anyway: no worker is killed, silenced or deleted, so every cleanup
// is a false positive.
func (h *harness) measureFalsePositives(ctx context.Context) error {
	o := h.o
	if o.stress {
		if _, err := exec.LookPath("stress-ng"); err != nil {
			return errors.New("stress-ng is not installed (apt-get install stress-ng), or pass -stress=false")
		}
	}
	fmt.Fprintf(h.out, "false positives: %s on %s for %s: %d socket + %d REST workers, %.0f tasks/s, stress-ng %v; worker timeout %s, sweeper interval %s, grace %s\n",
		o.bin, o.db, o.duration, o.socketWorkers, o.restWorkers, o.rate, o.stress, o.workerTimeout, o.sweepInterval, o.grace)
	load, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	for i := range o.socketWorkers {
		s := &restartable{kind: "socket", id: i}
		wg.Go(func() { h.slot(load, s, h.socketWorker) })
	}
	for i := range o.restWorkers {
		s := &restartable{kind: "rest", id: i}
		wg.Go(func() { h.slot(load, s, h.restWorker) })
	}
	wg.Go(func() { h.submit(load) })
	var stress *exec.Cmd
	if o.stress {
		stress = exec.CommandContext(load, "stress-ng", "--cpu", "0", "--timeout", strconv.Itoa(int(o.duration.Seconds()))+"s", "--quiet")
		if err := stress.Start(); err != nil {
			return fmt.Errorf("start stress-ng: %w", err)
		}
	}
	start := time.Now()
	h.printHeader()
	t := time.NewTicker(o.sample)
	defer t.Stop()
	for running := true; running; {
		select {
		case <-time.After(time.Until(start.Add(o.duration))):
			running = false
		case <-ctx.Done():
			return ctx.Err()
		case <-h.exited:
			return errors.New("the server exited during the load; see its log")
		case <-t.C:
			if s, err := h.sampleNow(ctx); err == nil {
				h.printSample(time.Since(start), s)
			}
		}
	}
	m, err := h.metrics(ctx)
	if err != nil {
		return err
	}
	stop()
	wg.Wait()
	if stress != nil {
		_ = stress.Wait()
	}
	evs, err := h.db.Q(ctx).ListCleanupEvents(models.CleanupEventFilter{}, 100_000)
	if err != nil {
		return err
	}
	byPath := map[string]int{}
	for _, e := range evs {
		if !e.Shadow {
			byPath[e.Path]++
		}
	}
	workers := o.socketWorkers + o.restWorkers
	fmt.Fprintf(h.out, "\nlive workers: %d for %s (%.0f worker-hours); tasks completed %d, claims %d\n",
		workers, o.duration.Round(time.Second), float64(workers)*o.duration.Hours(), h.completed.Load(), h.claims.Load())
	fmt.Fprintf(h.out, "cleanups of live workers (false positives): %d %v; joblib_false_positives_total %.0f; REST heartbeats answered 404: %d; worker errors %d\n",
		len(evs), byPath, sumPrefix(m, "joblib_false_positives_total"), h.reaped404.Load(), h.workerErrs.Load())
	return nil
}

// ---- SIGKILL to the UI's task_status_event ----

// measureSigkill runs -n rounds: a worker process (this program as
// hold-worker, on the Go SDK) claims a task and holds it; it is SIGKILLed;
// a UI joined to the task's room times the task_status_event that ends
// the task.
func (h *harness) measureSigkill(ctx context.Context) error {
	o := h.o
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	fmt.Fprintf(h.out, "sigkill: %s on %s, %d rounds; disconnect grace %s\n", o.bin, o.db, o.n, o.grace)
	type seen struct {
		status string
		at     time.Time
	}
	type watch struct {
		ch     chan seen
		killed time.Time // zero until the SIGKILL; earlier events are the task's own
	}
	var mu sync.Mutex
	ended := map[string]*watch{}
	ui, err := dialSIO(ctx, h.base, h.token, func(name string, arg json.RawMessage) {
		at := time.Now()
		if name != "task_status_event" {
			return
		}
		var ev struct {
			ID     string `json:"id"`
			Status string `json:"status"`
		}
		if json.Unmarshal(arg, &ev) != nil || (ev.Status != "failed" && ev.Status != "pending") {
			return
		}
		mu.Lock()
		w := ended[ev.ID]
		armed := w != nil && !w.killed.IsZero()
		mu.Unlock()
		if armed {
			select {
			case w.ch <- seen{ev.Status, at}:
			default:
			}
		}
	})
	if err != nil {
		return err
	}
	defer ui.close()
	if err := ui.emitOK(ctx, "join_room", map[string]any{"room_id": holdRoom}); err != nil {
		return err
	}
	var lat []float64
	for i := range o.n {
		cmd := exec.CommandContext(ctx, exe, "hold-worker", "-url", h.base, "-token", h.token)
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		lines := bufio.NewScanner(out)
		if !lines.Scan() || lines.Text() != "ready" {
			_ = cmd.Process.Kill()
			return fmt.Errorf("round %d: hold-worker did not start: %q", i, lines.Text())
		}
		var task struct {
			ID string `json:"id"`
		}
		if code, err := h.call(ctx, "POST", "/rooms/"+holdRoom+"/tasks/"+holdJob, map[string]any{"payload": map[string]any{}}, &task); err != nil || code != 202 {
			_ = cmd.Process.Kill()
			return fmt.Errorf("round %d: submit: %d %v", i, code, err)
		}
		w := &watch{ch: make(chan seen, 1)}
		mu.Lock()
		ended[task.ID] = w
		mu.Unlock()
		if !lines.Scan() || lines.Text() != "holding "+task.ID {
			_ = cmd.Process.Kill()
			return fmt.Errorf("round %d: hold-worker did not claim %s: %q", i, task.ID, lines.Text())
		}
		mu.Lock()
		w.killed = time.Now()
		killed := w.killed
		mu.Unlock()
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
		select {
		case s := <-w.ch:
			d := s.at.Sub(killed)
			lat = append(lat, d.Seconds())
			fmt.Fprintf(h.out, "round %2d: task %s %s after %s\n", i+1, task.ID[:8], s.status, d.Round(time.Millisecond))
		case <-time.After(o.grace + o.workerTimeout + o.sweepInterval + 30*time.Second):
			return fmt.Errorf("round %d: the UI never saw task %s end", i, task.ID)
		}
	}
	fmt.Fprintf(h.out, "\nSIGKILL → task_status_event at the UI over %d rounds: p50 %s s, p99 %s s, max %s s (grace %s)\n",
		len(lat), secs(quantile(lat, 0.5)), secs(quantile(lat, 0.99)), secs(quantile(lat, 1)), o.grace)
	return nil
}

const (
	holdRoom = "sigkill"
	holdJob  = "sigkill:modifiers:Hold"
)

// holdWorker is the worker process of -measure sigkill: a Go SDK worker
// that prints "ready", then "holding <task id>" for the task it claims, and
// holds it until killed.
func holdWorker(args []string) error {
	fs := flag.NewFlagSet("hold-worker", flag.ContinueOnError)
	base := fs.String("url", "", "server URL")
	token := fs.String("token", "", "API token")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx := context.Background()
	c, err := client.Dial(ctx, *base, *token, client.WithPollInterval(500*time.Millisecond))
	if err != nil {
		return err
	}
	if _, err := c.RegisterJob(ctx, holdRoom, "modifiers", "Hold", nil); err != nil {
		return err
	}
	fmt.Println("ready")
	return c.Run(ctx, func(ctx context.Context, t client.Task) (any, error) {
		fmt.Println("holding " + t.ID)
		<-ctx.Done()
		return nil, ctx.Err()
	})
}
