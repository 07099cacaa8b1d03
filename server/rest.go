package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/jsonguard"
	"github.com/zndraw/joblib/internal/limits"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

const prefix = "/v1/joblib"

func (s *Server) routes() {
	m := s.routeMux()
	// Every handler runs under its request class's database time budget,
	// except the long-polls (GET /tasks/{id}, provider reads), whose
	// statements are single-row reads and whose wait is bounded on its own.
	list := func(h http.HandlerFunc) http.HandlerFunc { return s.dbBudget(s.cfg.ReadDBTimeout, s.read(h)) }
	write := func(h http.HandlerFunc) http.HandlerFunc { return s.dbBudget(s.cfg.WriteDBTimeout, h) }
	m.HandleFunc("POST "+prefix+"/workers", write(s.createWorker))
	m.HandleFunc("GET "+prefix+"/workers", list(s.listWorkers))
	m.HandleFunc("PATCH "+prefix+"/workers/{id}", write(s.heartbeat))
	m.HandleFunc("DELETE "+prefix+"/workers/{id}", write(s.deleteWorker))

	m.HandleFunc("PUT "+prefix+"/rooms/{room}/jobs", write(s.registerJob))
	m.HandleFunc("GET "+prefix+"/rooms/{room}/jobs", list(s.listJobs))
	m.HandleFunc("GET "+prefix+"/rooms/{room}/jobs/{name...}", list(s.jobOrJobTasks))
	m.HandleFunc("GET "+prefix+"/rooms/{room}/workers", list(s.listRoomWorkers))
	m.HandleFunc("GET "+prefix+"/rooms/{room}/tasks", list(s.listRoomTasks))
	m.HandleFunc("POST "+prefix+"/rooms/{room}/tasks/{name...}", write(s.submitTask))

	m.HandleFunc("POST "+prefix+"/tasks/claim", s.routeHome(write(s.claimTask)))
	m.HandleFunc("POST "+prefix+"/tasks/claim-batch", s.routeHome(write(s.claimTasks)))
	m.HandleFunc("POST "+prefix+"/tasks/update-batch", write(s.updateTasks))
	m.HandleFunc("GET "+prefix+"/tasks/{id}", s.read(s.getTask))
	m.HandleFunc("PATCH "+prefix+"/tasks/{id}", s.routeHome(write(s.updateTask)))
	s.routesProviders(list, write)
	s.routesDashboard(write)
	s.routesOpenAPI()
	s.routesMethods()

	m.HandleFunc("GET /healthz", s.healthz)
	m.HandleFunc("GET /readyz", s.readyz)
}

// errDBBudget is the cause of a request context cancelled by its class's
// database time budget.
var errDBBudget = errors.New("request database time budget spent")

// dbBudget runs h with a context that is cancelled d after the request
// started, or after its body was read (a slow upload does not spend the
// database's time): every statement the request runs is cancelled then
// (pgx sends PostgreSQL a cancel request; SQLite is interrupted) and the
// client gets 503 statement-timeout.
func (s *Server) dbBudget(d time.Duration, h http.HandlerFunc) http.HandlerFunc {
	if d <= 0 {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithCancelCause(r.Context())
		defer cancel(nil)
		b := &budget{d: d, timer: time.AfterFunc(d, func() { cancel(errDBBudget) })}
		defer b.timer.Stop()
		h(w, r.WithContext(context.WithValue(ctx, budgetKey{}, b)))
	}
}

// dbBudgetContext is ctx cancelled with errDBBudget after d (not at all
// for d <= 0): the budget of work that is not an HTTP request.
func dbBudgetContext(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeoutCause(ctx, d, errDBBudget)
}

type budgetKey struct{}

// budget is a request's database time budget.
type budget struct {
	d     time.Duration
	timer *time.Timer
}

// pauseBudget stops the request's database time budget while its body
// is read.
func pauseBudget(ctx context.Context) {
	if b, ok := ctx.Value(budgetKey{}).(*budget); ok {
		b.timer.Stop()
	}
}

// restartBudget starts the request's database time budget afresh (once
// its body has been read).
func restartBudget(ctx context.Context) {
	if b, ok := ctx.Value(budgetKey{}).(*budget); ok && ctx.Err() == nil {
		b.timer.Reset(b.d)
	}
}

// principal authenticates the request or answers 401 and returns ok=false.
// A write authenticated only by the cookie must also pass the cross-site
// checks (403 otherwise).
func (s *Server) principal(w http.ResponseWriter, r *http.Request) (joblib.Principal, bool) {
	p, err := s.auth.authenticate(r.Context(), tokenFrom(r))
	if err == nil {
		err = s.checkCookieWrite(r)
	}
	err = explainUnauthorized(r, err)
	if err != nil {
		if errors.Is(err, joblib.ErrUnauthorized) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="joblib"`)
		}
		s.fail(w, r, err)
		return p, false
	}
	return p, true
}

// roomAccess asks the host (JOBLIB_ROOM_AUTH_URL) whether p may access each
// of rooms; it answers the first refusal (403) or outage (503) itself and
// returns false.
func (s *Server) roomAccess(w http.ResponseWriter, r *http.Request, p joblib.Principal, access string, rooms ...string) bool {
	if s.rooms == nil {
		return true
	}
	for _, room := range rooms {
		if err := s.rooms.check(r.Context(), p, tokenFrom(r), room, access); err != nil {
			s.fail(w, r, err)
			return false
		}
	}
	return true
}

// requestRooms returns the rooms a request under /rooms/{room} touches: the
// room in its URL (where the caller stands, and where a submitted task
// lands) and, when the route names a job or provider ({name...}: its
// details, its tasks, a submission to it, a provider read), the room that
// object belongs to. Reaching another room's object through one's own room
// or through @global therefore needs access to that room too.
func requestRooms(r *http.Request, room string) []string {
	rooms := []string{room}
	if own, ok := objectRoom(r.PathValue("name")); ok && own != room {
		rooms = append(rooms, own)
	}
	return rooms
}

// read wraps a GET handler: authenticated unless PublicReads is on, and,
// for a route under /rooms/{room}, read access to the room.
func (s *Server) read(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var p joblib.Principal
		if !s.cfg.PublicReads || (s.rooms != nil && tokenFrom(r) != "") {
			var ok bool
			if p, ok = s.principal(w, r); !ok {
				return
			}
		}
		if room := r.PathValue("room"); room != "" && joblib.ValidateRoomID(room) == nil {
			if !s.roomAccess(w, r, p, accessRead, requestRooms(r, room)...) {
				return
			}
		}
		h(w, r)
	}
}

// roomThenPrincipal validates the path's room before authenticating, the order
// the contract's write endpoints use (an invalid room is 400 even without
// credentials), then checks the caller's access to the rooms the request
// touches (requestRooms).
func (s *Server) roomThenPrincipal(w http.ResponseWriter, r *http.Request, access string) (string, joblib.Principal, bool) {
	room := r.PathValue("room")
	if err := joblib.ValidateRoomID(room); err != nil {
		s.fail(w, r, err)
		return "", joblib.Principal{}, false
	}
	p, ok := s.principal(w, r)
	if ok {
		ok = s.roomAccess(w, r, p, access, requestRooms(r, room)...)
	}
	return room, p, ok
}

// decodeBody reads a JSON object body into v. Oversized bodies answer 413,
// anything that is not a JSON object of the right shape 422.
func (s *Server) decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	pauseBudget(r.Context())
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	restartBudget(r.Context())
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			s.reject(w, r, joblib.CodePayloadTooLarge, limits.BodyBytes, fmt.Sprintf("request body exceeds %d bytes", tooBig.Limit))
			return false
		}
		badRequest(w, "could not read request body")
		return false
	}
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' {
		badRequest(w, "request body must be a JSON object")
		return false
	}
	// One linear pass before any decoding: nesting, UTF-8, and the escapes
	// and numbers the database would refuse.
	if err := jsonguard.Check(body, s.cfg.MaxJSONDepth); err != nil {
		limit := limits.JSONBytes
		if errors.Is(err, jsonguard.ErrTooDeep) {
			limit = limits.JSONDepth
		}
		s.reject(w, r, joblib.CodeValidation, limit, "invalid request body: "+err.Error())
		return false
	}
	body, err = exactMembers(body, v)
	if err == nil {
		err = json.Unmarshal(body, v)
	}
	if err != nil {
		badRequest(w, jsonProblem(err))
		return false
	}
	return true
}

// exactMembers keeps only the members of a JSON object whose names are
// exactly json field names of the struct v points to, with their values
// byte for byte. encoding/json matches names case-insensitively, so without
// this {"STATUS": "running"} would set Status (and override "status"); the
// contract, like every JSON API, treats such names as unknown fields, which
// are ignored.
func exactMembers(body []byte, v any) ([]byte, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(body, &members); err != nil {
		return nil, err
	}
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return body, nil
	}
	var out bytes.Buffer
	out.WriteByte('{')
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		raw, ok := members[name]
		if !ok {
			continue
		}
		if out.Len() > 1 {
			out.WriteByte(',')
		}
		key, _ := json.Marshal(name)
		out.Write(key)
		out.WriteByte(':')
		out.Write(raw)
	}
	out.WriteByte('}')
	return out.Bytes(), nil
}

// jsonProblem words a decoding error for the client.
func jsonProblem(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return fmt.Sprintf("field %q: expected %s, got JSON %s", te.Field, te.Type.String(), te.Value)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return "malformed JSON: " + se.Error()
	}
	return "invalid request body: " + err.Error()
}

func pathUUID(w http.ResponseWriter, r *http.Request, name string) (uuid.UUID, bool) {
	id, err := uuid.Parse(r.PathValue(name))
	if err != nil || len(r.PathValue(name)) != 36 {
		badRequest(w, fmt.Sprintf("path parameter %q must be a UUID", name))
		return uuid.Nil, false
	}
	return id, true
}

// maxPageLimit is the largest page size.
const maxPageLimit = 500

func (s *Server) pageParams(w http.ResponseWriter, r *http.Request) (joblib.PageParams, bool) {
	pg := joblib.PageParams{Limit: 50}
	q := r.URL.Query()
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > maxPageLimit {
			badRequest(w, fmt.Sprintf("limit must be an integer between 0 and %d", maxPageLimit))
			return pg, false
		}
		pg.Limit = n
	}
	if v := q.Get("offset"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			badRequest(w, "offset must be a non-negative integer")
			return pg, false
		}
		if n > s.cfg.MaxListOffset {
			s.reject(w, r, joblib.CodeValidation, limits.ListOffset,
				fmt.Sprintf("offset must be at most %d; narrow the listing with ?status= instead", s.cfg.MaxListOffset))
			return pg, false
		}
		pg.Offset = n
	}
	return pg, true
}

func (s *Server) taskListParams(w http.ResponseWriter, r *http.Request) (joblib.TaskListParams, bool) {
	pg, ok := s.pageParams(w, r)
	if !ok {
		return joblib.TaskListParams{}, false
	}
	status := r.URL.Query().Get("status")
	if status != "" && !joblib.ValidStatus(status) {
		badRequest(w, "status must be one of pending, claimed, running, completed, failed, cancelled")
		return joblib.TaskListParams{}, false
	}
	return joblib.TaskListParams{Status: status, Page: pg}, true
}

var preferWait = regexp.MustCompile(`\bwait=(\d+)\b`)

// parsePreferWait reads `Prefer: wait=N` (RFC 7240) the way the contract does:
// the first wait=<digits> token; anything else means no wait.
func parsePreferWait(h string) (time.Duration, bool) {
	m := preferWait.FindStringSubmatch(h)
	if m == nil {
		return 0, false
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil || n > 1<<31 {
		n = 1 << 31
	}
	return time.Duration(n) * time.Second, true
}

// --- workers

func (s *Server) createWorker(w http.ResponseWriter, r *http.Request) {
	p, ok := s.principal(w, r)
	if !ok {
		return
	}
	out, err := s.svc.CreateWorker(r.Context(), p)
	if err == nil {
		s.pokeDashboard()
	}
	s.answer(w, r, http.StatusCreated, out, err)
}

func (s *Server) listWorkers(w http.ResponseWriter, r *http.Request) {
	pg, ok := s.pageParams(w, r)
	if !ok {
		return
	}
	out, err := s.svc.ListWorkers(r.Context(), pg)
	s.answer(w, r, http.StatusOK, out, err)
}

func (s *Server) heartbeat(w http.ResponseWriter, r *http.Request) {
	p, ok := s.principal(w, r)
	if !ok {
		return
	}
	id, ok := pathUUID(w, r, "id")
	if !ok {
		return
	}
	out, err := s.svc.Heartbeat(r.Context(), p, id)
	s.answer(w, r, http.StatusOK, out, err)
}

func (s *Server) deleteWorker(w http.ResponseWriter, r *http.Request) {
	p, ok := s.principal(w, r)
	if !ok {
		return
	}
	id, ok := pathUUID(w, r, "id")
	if !ok {
		return
	}
	if _, err := s.svc.DeleteWorker(r.Context(), p, id); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) listRoomWorkers(w http.ResponseWriter, r *http.Request) {
	pg, ok := s.pageParams(w, r)
	if !ok {
		return
	}
	out, err := s.svc.ListRoomWorkers(r.Context(), r.PathValue("room"), pg)
	s.answer(w, r, http.StatusOK, out, err)
}

// --- jobs

type registerJobBody struct {
	Category     *string         `json:"category"`
	Name         *string         `json:"name"`
	Schema       json.RawMessage `json:"schema"`
	SchemaAlias  json.RawMessage `json:"schema_"`
	WorkerID     *uuid.UUID      `json:"worker_id"`
	OnWorkerLoss string          `json:"on_worker_loss"`
	MaxAttempts  int             `json:"max_attempts"`
	// Task limits in seconds and the timeout policy (optional).
	TaskTimeout      *int   `json:"task_timeout"`
	HeartbeatTimeout *int   `json:"heartbeat_timeout"`
	OnTimeout        string `json:"on_timeout"`
	// Retry is the job's retry of failed reports (optional).
	Retry *joblib.RetryPolicy `json:"retry"`
}

// schemaOf picks the schema field (or its alias) and checks it is an object.
func schemaOf(w http.ResponseWriter, main, alias json.RawMessage) (json.RawMessage, bool) {
	raw := main
	if len(raw) == 0 {
		raw = alias
	}
	t := bytes.TrimSpace(raw)
	if len(t) > 0 && t[0] != '{' {
		badRequest(w, `field "schema": expected a JSON object`)
		return nil, false
	}
	return raw, true
}

func (s *Server) registerJob(w http.ResponseWriter, r *http.Request) {
	room, p, ok := s.roomThenPrincipal(w, r, accessWrite)
	if !ok {
		return
	}
	var b registerJobBody
	if !s.decodeBody(w, r, &b) {
		return
	}
	if b.Category == nil || b.Name == nil {
		badRequest(w, `fields "category" and "name" are required strings`)
		return
	}
	schema, ok := schemaOf(w, b.Schema, b.SchemaAlias)
	if !ok {
		return
	}
	job, created, err := s.svc.RegisterJob(r.Context(), p, room, joblib.RegisterJobParams{
		Category: *b.Category, Name: *b.Name, Schema: schema, WorkerID: b.WorkerID,
		OnWorkerLoss: b.OnWorkerLoss, MaxAttempts: b.MaxAttempts,
		TaskTimeout: b.TaskTimeout, HeartbeatTimeout: b.HeartbeatTimeout, OnTimeout: b.OnTimeout, Retry: b.Retry,
	})
	s.answer(w, r, createdOrOK(created), job, err)
}

func (s *Server) listJobs(w http.ResponseWriter, r *http.Request) {
	pg, ok := s.pageParams(w, r)
	if !ok {
		return
	}
	out, err := s.svc.ListJobs(r.Context(), r.PathValue("room"), pg)
	s.answer(w, r, http.StatusOK, out, err)
}

// jobOrJobTasks serves both /jobs/{full_name} and /jobs/{full_name}/tasks:
// the name may contain '/', and like the contract the /tasks suffix wins.
func (s *Server) jobOrJobTasks(w http.ResponseWriter, r *http.Request) {
	room, name := r.PathValue("room"), r.PathValue("name")
	if job, ok := strings.CutSuffix(name, "/tasks"); ok {
		lp, ok := s.taskListParams(w, r)
		if !ok {
			return
		}
		out, err := s.svc.ListJobTasks(r.Context(), room, job, lp)
		s.answer(w, r, http.StatusOK, out, err)
		return
	}
	out, err := s.svc.GetJob(r.Context(), room, name)
	s.answer(w, r, http.StatusOK, out, err)
}

// --- tasks

func (s *Server) listRoomTasks(w http.ResponseWriter, r *http.Request) {
	lp, ok := s.taskListParams(w, r)
	if !ok {
		return
	}
	out, err := s.svc.ListRoomTasks(r.Context(), r.PathValue("room"), lp)
	s.answer(w, r, http.StatusOK, out, err)
}

func (s *Server) submitTask(w http.ResponseWriter, r *http.Request) {
	room, p, ok := s.roomThenPrincipal(w, r, accessWrite)
	if !ok {
		return
	}
	key, ok := idempotencyKey(w, r)
	if !ok {
		return
	}
	sub := joblib.Submission{Room: room, FullName: r.PathValue("name"), IdempotencyKey: key}
	if name, batch := strings.CutSuffix(sub.FullName, "/batch"); batch {
		sub.FullName, sub.Batch = name, true
		var b struct {
			Tasks json.RawMessage `json:"tasks"`
		}
		if !s.decodeBody(w, r, &b) {
			return
		}
		if sub.Payloads, sub.Timeouts, sub.Scheds, ok = batchPayloads(w, b.Tasks); !ok {
			return
		}
	} else {
		var b struct {
			Payload json.RawMessage `json:"payload"`
			// Timeout is the task's own task_timeout in seconds (optional).
			Timeout *int `json:"timeout"`
			// Priority, and run_at (RFC 3339) or delay (seconds): optional.
			Priority json.RawMessage `json:"priority"`
			RunAt    json.RawMessage `json:"run_at"`
			Delay    json.RawMessage `json:"delay"`
		}
		if !s.decodeBody(w, r, &b) {
			return
		}
		if t := bytes.TrimSpace(b.Payload); len(t) > 0 && t[0] != '{' {
			badRequest(w, `field "payload": expected a JSON object`)
			return
		}
		sc, problem := schedOf("", b.Priority, b.RunAt, b.Delay)
		if problem != "" {
			badRequest(w, problem)
			return
		}
		sub.Payloads, sub.Timeouts, sub.Scheds = []json.RawMessage{b.Payload}, []*int{b.Timeout}, []models.TaskSched{sc}
	}
	out, err := s.svc.Submit(r.Context(), p, sub)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !sub.Batch && out.Tasks[0].Status != "failed" {
		w.Header().Set("Location", prefix+"/tasks/"+out.Tasks[0].ID.String())
		w.Header().Set("Retry-After", "1")
	}
	if out.Replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	_, _ = w.Write(append(out.Body, '\n'))
}

// idempotencyKey reads the Idempotency-Key header: absent is "", present
// it must be one value of 1 to 255 printable characters (else 422).
func idempotencyKey(w http.ResponseWriter, r *http.Request) (string, bool) {
	vs := r.Header.Values("Idempotency-Key")
	if len(vs) == 0 {
		return "", true
	}
	if len(vs) > 1 {
		badRequest(w, "Idempotency-Key must be given once")
		return "", false
	}
	if err := joblib.ValidateIdempotencyKey(vs[0]); err != nil {
		e, _ := joblib.AsError(err)
		badRequest(w, e.Detail)
		return "", false
	}
	return vs[0], true
}

// schedOf reads a submission's priority, run_at and delay members (raw
// JSON; absent or null: not given); problem is the 422 detail of a member
// that is not what it must be (field prefixes its name).
func schedOf(field string, priority, runAt, delay json.RawMessage) (sc models.TaskSched, problem string) {
	given := func(raw json.RawMessage) bool { t := bytes.TrimSpace(raw); return len(t) > 0 && string(t) != "null" }
	if given(priority) {
		if json.Unmarshal(priority, &sc.Priority) != nil {
			return sc, fmt.Sprintf(`field "%spriority": expected an integer from %d to %d`, field, joblib.MinPriority, joblib.MaxPriority)
		}
	}
	if given(runAt) {
		var s string
		if json.Unmarshal(runAt, &s) != nil {
			return sc, fmt.Sprintf(`field "%srun_at": expected an RFC 3339 time`, field)
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return sc, fmt.Sprintf(`field "%srun_at": expected an RFC 3339 time such as 2026-01-02T15:04:05Z, got %q`, field, s)
		}
		sc.RunAt = &t
	}
	if given(delay) {
		var d float64
		if json.Unmarshal(delay, &d) != nil {
			return sc, fmt.Sprintf(`field "%sdelay": expected a number of seconds`, field)
		}
		sc.Delay = &d
	}
	if sc.RunAt != nil && sc.Delay != nil {
		return sc, fmt.Sprintf(`fields "%srun_at" and "%sdelay" are exclusive; give one`, field, field)
	}
	return sc, ""
}

// batchPayloads checks the "tasks" member of a batch submission: an array
// of {"payload": {...}, "timeout"?: seconds, "priority"?, "run_at"? or
// "delay"?} objects.
func batchPayloads(w http.ResponseWriter, tasks json.RawMessage) ([]json.RawMessage, []*int, []models.TaskSched, bool) {
	var items []map[string]json.RawMessage
	if t := bytes.TrimSpace(tasks); len(t) == 0 || t[0] != '[' || json.Unmarshal(t, &items) != nil {
		badRequest(w, `field "tasks": expected an array of {"payload": {...}} objects`)
		return nil, nil, nil, false
	}
	out := make([]json.RawMessage, len(items))
	timeouts := make([]*int, len(items))
	scheds := make([]models.TaskSched, len(items))
	for i, it := range items {
		if it == nil {
			badRequest(w, fmt.Sprintf(`field "tasks[%d]": expected an object {"payload": {...}}`, i))
			return nil, nil, nil, false
		}
		pl := bytes.TrimSpace(it["payload"])
		if len(pl) > 0 && pl[0] != '{' {
			badRequest(w, fmt.Sprintf(`field "tasks[%d].payload": expected a JSON object`, i))
			return nil, nil, nil, false
		}
		out[i] = pl
		if raw, ok := it["timeout"]; ok && string(bytes.TrimSpace(raw)) != "null" {
			var v int
			if err := json.Unmarshal(raw, &v); err != nil {
				badRequest(w, fmt.Sprintf(`field "tasks[%d].timeout": expected an integer number of seconds`, i))
				return nil, nil, nil, false
			}
			timeouts[i] = &v
		}
		var problem string
		if scheds[i], problem = schedOf(fmt.Sprintf("tasks[%d].", i), it["priority"], it["run_at"], it["delay"]); problem != "" {
			badRequest(w, problem)
			return nil, nil, nil, false
		}
	}
	return out, timeouts, scheds, true
}

func (s *Server) claimTask(w http.ResponseWriter, r *http.Request) {
	p, ok := s.principal(w, r)
	if !ok {
		return
	}
	var b struct {
		WorkerID *uuid.UUID `json:"worker_id"`
	}
	if !s.decodeBody(w, r, &b) {
		return
	}
	if b.WorkerID == nil {
		badRequest(w, `field "worker_id" is required`)
		return
	}
	task, err := s.svc.ClaimTask(r.Context(), p, *b.WorkerID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Task *joblib.Task `json:"task"`
	}{task})
}

// claimTasks is the batch claim (beyond the contract): up to limit of the
// oldest pending tasks of the worker's jobs in one request, answered as
// {"tasks": [...]} (empty when nothing is claimable); with "start": true
// they are claimed and started (running) in one step.
func (s *Server) claimTasks(w http.ResponseWriter, r *http.Request) {
	p, ok := s.principal(w, r)
	if !ok {
		return
	}
	var b struct {
		WorkerID *uuid.UUID `json:"worker_id"`
		Limit    *int       `json:"limit"`
		Start    bool       `json:"start"`
	}
	if !s.decodeBody(w, r, &b) {
		return
	}
	if b.WorkerID == nil {
		badRequest(w, `field "worker_id" is required`)
		return
	}
	limit := 1
	if b.Limit != nil {
		limit = *b.Limit
	}
	tasks, err := s.svc.ClaimTasks(r.Context(), p, *b.WorkerID, limit, b.Start)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if tasks == nil {
		tasks = []joblib.Task{}
	}
	writeJSON(w, http.StatusOK, struct {
		Tasks []joblib.Task `json:"tasks"`
	}{tasks})
}

func (s *Server) getTask(w http.ResponseWriter, r *http.Request) {
	id, ok := pathUUID(w, r, "id")
	if !ok {
		return
	}
	if s.rooms != nil {
		// The task's room is only known from the task.
		t, err := s.svc.GetTask(r.Context(), id)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		var p joblib.Principal
		if tokenFrom(r) != "" {
			var ok bool
			if p, ok = s.principal(w, r); !ok {
				return
			}
		}
		if !s.roomAccess(w, r, p, accessRead, t.RoomID) {
			return
		}
	}
	wait, _ := parsePreferWait(r.Header.Get("Prefer"))
	task, effective, waited, err := s.svc.WaitTask(r.Context(), id, wait)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if waited {
		w.Header().Set("Preference-Applied", "wait="+strconv.Itoa(int(effective/time.Second)))
	}
	writeJSON(w, http.StatusOK, task)
}

func (s *Server) updateTask(w http.ResponseWriter, r *http.Request) {
	p, ok := s.principal(w, r)
	if !ok {
		return
	}
	id, ok := pathUUID(w, r, "id")
	if !ok {
		return
	}
	var b struct {
		Status *string         `json:"status"`
		Error  *string         `json:"error"`
		Result json.RawMessage `json:"result"`
		// Progress is the holder's progress report, alone or with a status.
		Progress json.RawMessage `json:"progress"`
		// Retry false makes a failed report final, whatever the job's retry.
		Retry *bool `json:"retry"`
	}
	if !s.decodeBody(w, r, &b) {
		return
	}
	if pr, ok := progressOf(b.Progress); ok {
		task, err := s.svc.ReportProgress(r.Context(), p, id, pr)
		if b.Status == nil {
			s.answer(w, r, http.StatusOK, task, err)
			return
		}
		// With a status, the transition decides the answer: a progress the
		// task does not take (a superuser's override, a task that is not
		// held) is dropped, as before progress existed.
		if _, refused := joblib.AsError(err); err != nil && !refused {
			s.fail(w, r, err)
			return
		}
	}
	if b.Status == nil || !joblib.ValidStatus(*b.Status) {
		badRequest(w, `field "status" must be one of pending, claimed, running, completed, failed, cancelled`)
		return
	}
	task, err := s.svc.UpdateTaskReport(r.Context(), p, joblib.TaskUpdate{TaskID: id, Status: *b.Status, Error: b.Error, Result: b.Result, NoRetry: b.Retry != nil && !*b.Retry})
	s.answer(w, r, http.StatusOK, task, err)
}

// progressOf reads the "progress" of a task update: an object {current,
// total, message}, or a bare number taken as current. Any other value is
// ignored, as every field the server did not know was before progress
// existed.
func progressOf(raw json.RawMessage) (joblib.Progress, bool) {
	var pr joblib.Progress
	t := bytes.TrimSpace(raw)
	if len(t) == 0 {
		return pr, false
	}
	switch t[0] {
	case '{':
		return pr, json.Unmarshal(t, &pr) == nil
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		var n float64
		if json.Unmarshal(t, &n) != nil {
			return pr, false
		}
		pr.Current = &n
		return pr, true
	}
	return pr, false
}

// --- health

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if err := s.svc.DB().Ping(r.Context()); err != nil {
		writeProblem(w, Problem{Type: "/v1/problems/not-ready", Title: http.StatusText(503), Status: 503, Detail: "database unreachable"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}
