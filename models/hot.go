package models

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The hot statements: what workers do all day (claim, report status,
// heartbeat, submit), each one PostgreSQL statement sent over pgx (prepared
// once per connection and cached by pgx), autocommit, with the caller's
// authorization folded into its WHERE clause and the event's NOTIFY built
// from the changed row inside the same statement. They cover the common,
// successful case only: when one changes nothing, the caller falls back to
// the general transaction, which tells the reasons apart (not found,
// forbidden, a transition that is not allowed) and produces the answer.

// ErrNoHotPath is returned by the hot statements on SQLite, which has none.
var ErrNoHotPath = errors.New("no hot path on this database")

// HotNotify tells a hot statement how to send other nodes the status events
// of the tasks it changes, written to the event outbox (see RelayOutbox)
// when Channel is set, in the frame of events.NotifyFrame: each event is the
// item Open + JSON(RoomPrefix + room) + Middle + the event object + Close.
// A statement writes one row, Head + its items in seq order separated by
// commas + Tail, when that fits in MaxBytes, and otherwise one row per item
// (Head + item + Tail): an outbox row costs PostgreSQL an insert, an index
// entry and a delete, whatever it carries. The zero value sends nothing.
type HotNotify struct {
	Channel, Head, Open, Middle, Close, Tail string
	// RoomPrefix turns a task's room id into the event's room name.
	RoomPrefix string
	// MaxBytes bounds the payload (a NOTIFY's limit); a larger one is not
	// written and the row comes back with Notified false (the caller
	// publishes it).
	MaxBytes int
	// ID is the frame's batch id (events.NotifyFrame.ID): each notified
	// HotTask carries it as Frame.
	ID uint64
}

// hotTaskCols are the columns scanTask reads, from the changed task u and
// its job j.
const hotTaskCols = `u.id, u.seq, u.job_id, u.worker_id, u.lost_worker_id, u.room_id, u.created_by_id, u.payload, u.status, u.attempt,
 u.created_at, u.claimed_at, u.started_at, u.completed_at, u.error, u.result,
 j.room_id, j.category, j.name, j.on_worker_loss, j.max_attempts,
 u.task_timeout, u.heartbeat_timeout, u.deadline_at, u.progress_current, u.progress_total, u.progress_message, u.progress_at, j.on_timeout,
 u.priority, u.run_at, u.errors`

// hotStatusEvent is the task_status_event object of the changed task u
// (%[1]s: the queue position expression).
const hotStatusEvent = `json_build_object('id', u.id, 'name', j.room_id || ':' || j.category || ':' || j.name, 'room_id', u.room_id,
 'status', u.status, 'created_at', u.created_at, 'started_at', u.started_at, 'completed_at', u.completed_at,
 'queue_position', %[1]s, 'worker_id', u.worker_id, 'error', u.error)::text`

// hotItem is the frame item of the status event of the changed task u
// (with its job j), from the HotNotify arguments (see HotNotify.set).
func hotItem(qp string) string {
	return `@open || to_json(@room_prefix || u.room_id)::text || @middle || ` + fmt.Sprintf(hotStatusEvent, qp) + ` || @close`
}

// hotFrameBytes is the length of a payload's head and tail.
const hotFrameBytes = `(octet_length(@head) + octet_length(@tail))`

// hotJobReturning, after RETURNING t.* in a hot statement's change to tasks
// t, is the columns of the changed task's job that the answer and the
// events need, as one array jv read by the job's key; hotJobOf, after
// "FROM u", names them j.room_id, j.category and so on, as if jobs j were
// joined on. So each task's job is read once, always by its key:
//   - joined in the events' CTE and again in the answer, it was read twice
//     (about 2 of the 32 shared buffers a status report touched per task);
//   - joined in a CTE of its own, or in the change, the cached generic plan
//     (which expects ten changed tasks) hashed the whole jobs table at every
//     execution once it held a few hundred jobs, and a CTE carried every
//     column of the tasks through two more plan nodes, which PostgreSQL
//     sets up at every execution (bench/claim, BENCHMARKS.md).
const (
	hotJobReturning = `(SELECT ARRAY[j.room_id, j.category, j.name, j.on_worker_loss, j.max_attempts::text, j.on_timeout]
		FROM jobs j WHERE j.id = t.job_id) AS jv`
	hotJobOf = `CROSS JOIN LATERAL (SELECT u.jv[1] AS room_id, u.jv[2] AS category, u.jv[3] AS name, u.jv[4] AS on_worker_loss,
	u.jv[5]::integer AS max_attempts, u.jv[6] AS on_timeout) j`
)

// hotOutbox is the CTEs that write the status events of the changed tasks
// u (with their job's columns, see hotJobReturning) to the event outbox, as one row when
// they fit in one payload and one row per event otherwise (see HotNotify);
// hotNotified is the column saying whether a task's event was written. A
// payload of k items is the sum of (item + 1) - 1 + the frame bytes long.
// The items are built only when a channel is set.
const hotOutbox = `, ev AS (
	SELECT u.id, u.seq, ` + "%s" + ` AS it FROM u ` + hotJobOf + ` WHERE @channel <> ''
), ob AS (
	INSERT INTO joblib_event_outbox (payload)
	SELECT @head || string_agg(it, ',' ORDER BY seq) || @tail FROM ev
	HAVING sum(octet_length(it) + 1) + ` + hotFrameBytes + ` <= @max_bytes
	UNION ALL
	(SELECT @head || it || @tail FROM ev
	WHERE octet_length(it) + ` + hotFrameBytes + ` < @max_bytes AND (SELECT sum(octet_length(it) + 1) FROM ev) + ` + hotFrameBytes + ` > @max_bytes
	ORDER BY seq)
	RETURNING 1
)`

const hotNotified = "COALESCE(octet_length(ev.it) + " + hotFrameBytes + " < @max_bytes, false)"

// hotCounted is the CTE with which a hot statement keeps the task counts
// itself, in place of the statement trigger on tasks (see migrations 161 and
// 180): the delta rows (status, d) of its changes, from the query in %s,
// with columns status and d, one row per task and status. hotCountedQual,
// in the condition of the statement's change to tasks, marks the
// transaction counted (a transaction-local setting) before that change
// ends, which is when PostgreSQL decides whether the statement trigger
// fires: the trigger's WHEN clause then skips it, without calling the
// function. It is a condition without columns, so PostgreSQL evaluates it
// once, before the first row, even when no row changes; and the CTE, a
// data-modifying one, always runs to the end: both or neither. A hot
// statement runs in a transaction of its own (a pool connection's implicit
// one, see queryHot), so no later change in that transaction goes
// uncounted.
const hotCounted = `, cnt AS (
	INSERT INTO task_count_deltas (status, d)
	SELECT status, sum(d) FROM (%s) c GROUP BY status HAVING sum(d) <> 0
	RETURNING 1
)`

// hotCountedQual marks the transaction counted (see hotCounted); it is
// always true.
const hotCountedQual = `(SELECT set_config('joblib.counted', 'on', true)) = 'on'`

// set adds the HotNotify fields to a hot statement's named arguments.
func (h HotNotify) set(a pgx.NamedArgs) pgx.NamedArgs {
	a["channel"], a["head"], a["open"], a["middle"], a["close"], a["tail"], a["room_prefix"], a["max_bytes"] = h.Channel, h.Head, h.Open, h.Middle, h.Close, h.Tail, h.RoomPrefix, h.MaxBytes
	return a
}

// HotTask is a task a hot statement changed, and whether its status event
// was written to the event outbox by the statement (for other nodes).
type HotTask struct {
	Task
	Notified bool
	// Frame is the batch id its event was written to the outbox under
	// (HotNotify.ID); 0 when not Notified.
	Frame uint64
}

// framed returns t with Frame set when its event was written under n.
func (n HotNotify) framed(t HotTask) HotTask {
	if t.Notified {
		t.Frame = n.ID
	}
	return t
}

func scanHotTask(row pgx.Rows) (HotTask, error) {
	var t HotTask
	err := row.Scan(&t.ID, &t.Seq, &t.JobID, &t.WorkerID, &t.LostWorkerID, &t.RoomID, &t.CreatedByID, &t.Payload, &t.Status, &t.Attempt,
		&t.CreatedAt, &t.ClaimedAt, &t.StartedAt, &t.CompletedAt, &t.Error, &t.Result,
		&t.JobRoom, &t.JobCategory, &t.JobName, &t.OnWorkerLoss, &t.MaxAttempts,
		&t.TaskTimeout, &t.HeartbeatTimeout, &t.DeadlineAt, &t.ProgressCurrent, &t.ProgressTotal, &t.ProgressMessage, &t.ProgressAt, &t.OnTimeout,
		&t.Priority, &t.RunAt, &t.Errors,
		&t.QueuePosition, &t.Notified)
	return t, err
}

// The parts claimSQL and claimGroupSQL share. claimHeadSQL is the first
// claimable task of the job l.job_id; claimPickSQL, after a select list on
// tasks t, walks the claimable tasks of the job h.job_id in claim order,
// locking them with SKIP LOCKED, up to the limit in %s; claimSetSQL is the
// claim's change to a task, but for its worker_id; claimCounted writes its
// count deltas.
const (
	claimHeadSQL = `SELECT t.priority, t.seq FROM tasks t WHERE t.job_id = l.job_id AND t.status = 'pending' AND NOT t.delayed ORDER BY t.priority DESC, t.seq LIMIT 1`
	claimPickSQL = `FROM tasks t
		WHERE t.job_id = h.job_id AND t.status = 'pending' AND NOT t.delayed
		ORDER BY t.priority DESC, t.seq LIMIT %s
		FOR UPDATE OF t SKIP LOCKED`
	claimSetSQL = `status = CASE WHEN @start::boolean THEN 'running' ELSE 'claimed' END, attempt = t.attempt + 1,
		claimed_at = now(), started_at = CASE WHEN @start THEN now() ELSE t.started_at END, updated_at = now(),
		deadline_at = now() + LEAST(t.task_timeout, t.heartbeat_timeout) * interval '1 second',
		progress_current = NULL, progress_total = NULL, progress_message = NULL, progress_at = NULL`
)

var claimCounted = fmt.Sprintf(hotCounted, `SELECT c.status, c.d FROM u CROSS JOIN LATERAL (VALUES ('pending', -1), (u.status, 1)) c(status, d)`)

// claimSQL claims up to @limit tasks for worker @worker owned by user @user. The worker's
// jobs are taken in the order of their first claimable task (highest
// priority, then oldest: one probe of tasks_ready_idx, which holds the
// pending tasks that are not delayed, keyed (job_id, priority DESC, seq));
// within a job the claimable tasks are walked in that index's order and locked with SKIP LOCKED one at a time as
// the LIMIT pulls them, so the statement locks exactly the rows it claims,
// reads no pending row beyond them but the locked ones it skips, and never
// sorts pending rows, whatever the queue length or the statistics. (Locking
// only what it claims is what keeps a concurrent claimer from coming back
// empty, or out of order, while a task it may take is pending.) The update
// finds the picked rows by their primary key, as an array: joined on picked,
// the generic plan PostgreSQL may cache after five executions, which cannot
// know the LIMIT, hashed a sequential scan of every task. The worker
// row is held in key share, as models.LockWorker does, so a concurrent
// cleanup of the worker either finished first or sees these claims. The
// outer join returns one row with NULL task columns when nothing was
// claimed; its first column is false when the worker does not exist or
// belongs to someone else. With @start the tasks go to running at once.
var claimSQL = `WITH w AS (
	SELECT id FROM workers WHERE id = @worker AND user_id = @user FOR KEY SHARE
), heads AS (
	SELECT l.job_id, hd.priority, hd.seq
	FROM w JOIN worker_job_links l ON l.worker_id = w.id
	JOIN jobs jj ON jj.id = l.job_id AND jj.room_id <> '@internal'
	CROSS JOIN LATERAL (
		` + claimHeadSQL + `
	) hd
), picked AS (
	SELECT c.id FROM (SELECT job_id, priority, seq FROM heads ORDER BY priority DESC, seq) h
	CROSS JOIN LATERAL (
		SELECT t.id ` + fmt.Sprintf(claimPickSQL, "@limit") + `
	) c
	LIMIT @limit
), u AS (
	UPDATE tasks t SET worker_id = @worker, ` + claimSetSQL + `
	WHERE t.id = ANY(ARRAY(SELECT id FROM picked)) AND ` + hotCountedQual + `
	RETURNING t.*, ` + hotJobReturning + `
)` + fmt.Sprintf(hotOutbox, hotItem("NULL")) + claimCounted + `
SELECT EXISTS (SELECT 1 FROM w), ` + hotTaskCols + `, NULL::bigint AS qp, ` + hotNotified + `
FROM (SELECT 1) one LEFT JOIN (u ` + hotJobOf + ` LEFT JOIN ev ON ev.id = u.id) ON true`

// claimArgs are claimSQL's arguments.
func claimArgs(workerID, userID uuid.UUID, limit int, start bool, n HotNotify) pgx.NamedArgs {
	return n.set(pgx.NamedArgs{"worker": workerID, "user": userID, "limit": limit, "start": start})
}

// ClaimTasksHot claims up to limit of the oldest pending tasks of the
// worker's (non-internal) jobs in one statement, in seq order (with start,
// claimed and started: running). owned is false
// when the worker does not exist or is not the user's; the caller then takes
// the general path for the precise answer.
func (db *DB) ClaimTasksHot(ctx context.Context, workerID, userID uuid.UUID, limit int, start bool, n HotNotify) (owned bool, ts []HotTask, err error) {
	if db.Pool == nil {
		return false, nil, ErrNoHotPath
	}
	scan := func(rows pgx.Rows) error {
		owned, ts = false, nil
		for rows.Next() {
			var r claimRow
			if err := rows.Scan(r.dest()...); err != nil {
				return err
			}
			owned = r.ok
			if t, ok := r.task(n); ok {
				ts = append(ts, t)
			}
		}
		return rows.Err()
	}
	// A batch claim, or one that starts its tasks, took a custom plan at
	// every execution (0.3 ms each): its generic plan claims as well
	// (TestPlansAtScale), so it is forced (see claimGenericPlanSQL). A single
	// claim gets the generic plan from PostgreSQL's own choice.
	pre := []any{claimPlanSQL}
	if limit > 1 || start {
		pre = []any{claimGenericPlanSQL}
	}
	if err := db.queryHot(ctx, pre, claimSQL, claimArgs(workerID, userID, limit, start, n), scan); err != nil {
		return false, nil, fmt.Errorf("claim tasks: %w", mapErr(err))
	}
	slices.SortFunc(ts, claimOrder)
	return owned, ts, nil
}

// claimOrder is the order of a claim's tasks: highest priority, then oldest.
// The hot statements return their rows in no order and the answer is sorted
// here: a sort in the statement costs its plan two more nodes as wide as a
// task, set up at every execution.
func claimOrder(a, b HotTask) int {
	if c := cmp.Compare(b.Priority, a.Priority); c != 0 {
		return c
	}
	return cmp.Compare(a.Seq, b.Seq)
}

// claimRow is one row of a claim statement: whether the worker is the
// caller's, then the task columns, NULL on the row of a claim that took
// nothing.
type claimRow struct {
	ok                      bool
	id, jobID               *uuid.UUID
	seq                     *int64
	roomID, payload, status *string
	attempt, priority       *int
	t                       HotTask
}

// dest is the row's scan destinations, in claimSQL's column order.
func (r *claimRow) dest() []any {
	t := &r.t
	return []any{&r.ok, &r.id, &r.seq, &r.jobID, &t.WorkerID, &t.LostWorkerID, &r.roomID, &t.CreatedByID, &r.payload, &r.status, &r.attempt,
		&t.CreatedAt, &t.ClaimedAt, &t.StartedAt, &t.CompletedAt, &t.Error, &t.Result,
		&t.JobRoom, &t.JobCategory, &t.JobName, &t.OnWorkerLoss, &t.MaxAttempts,
		&t.TaskTimeout, &t.HeartbeatTimeout, &t.DeadlineAt, &t.ProgressCurrent, &t.ProgressTotal, &t.ProgressMessage, &t.ProgressAt, &t.OnTimeout,
		&r.priority, &t.RunAt, &t.Errors,
		&t.QueuePosition, &t.Notified}
}

// task is the claimed task of the row; false on a row without one.
func (r *claimRow) task(n HotNotify) (HotTask, bool) {
	if r.id == nil {
		return HotTask{}, false
	}
	t := r.t
	if r.priority != nil {
		t.Priority = *r.priority
	}
	t.ID, t.Seq, t.JobID, t.RoomID, t.Payload, t.Status, t.Attempt = *r.id, *r.seq, *r.jobID, *r.roomID, *r.payload, *r.status, *r.attempt
	return n.framed(t), true
}

// ClaimRequest is one worker's claim in a group claim (ClaimGroupHot), by
// User, whose worker it must be.
type ClaimRequest struct {
	Worker uuid.UUID
	User   uuid.UUID
	Limit  int
}

// ClaimAnswer is a group claim's answer to one ClaimRequest. Served is
// false when the group statement left the request alone (the worker is not
// the caller's, has no jobs, or serves other jobs than the group's first
// worker): the caller then claims for it on its own (ClaimTasksHot).
type ClaimAnswer struct {
	Served bool
	Tasks  []HotTask
}

// claimGroupSQL claims for several workers in one statement: @workers
// (distinct) with @limits tasks each, in that order, each on behalf of its
// user in @users (one group carries the claims of many users, each checked
// against its own). It serves the requests whose workers are their user's
// and serve exactly the
// (non-internal) jobs of the first such worker, the common case of a fleet of
// alike workers; the others come back unserved. For the served ones it walks
// their jobs' claimable tasks as claimSQL does for one worker, for the sum of
// their limits, and hands them out in that order: the first request the first
// @limits[1] tasks, the next the following ones, and so on. One statement
// locks every task it takes, so two requests of a group never meet on a task,
// and a concurrent claimer skips them as it skips any locked task. The
// workers are held in key share in seq order, the order in which a cleanup
// locks workers, so a cleanup and a group claim cannot deadlock.
var claimGroupSQL = `WITH r AS (
	SELECT r.worker_id, r.user_id, r.n, r.ord FROM unnest(@workers::uuid[], @users::uuid[], @limits::int[]) WITH ORDINALITY AS r(worker_id, user_id, n, ord)
), w AS (
	SELECT id FROM workers WHERE id = ANY(@workers::uuid[])
		AND EXISTS (SELECT 1 FROM r WHERE r.worker_id = workers.id AND r.user_id = workers.user_id)
	ORDER BY seq FOR KEY SHARE
), js AS (
	SELECT w.id, array_agg(l.job_id ORDER BY l.job_id) AS jobs
	FROM w JOIN worker_job_links l ON l.worker_id = w.id
	JOIN jobs jj ON jj.id = l.job_id AND jj.room_id <> '@internal'
	GROUP BY w.id
), g AS (
	SELECT r.worker_id, r.n, sum(r.n) OVER (ORDER BY r.ord) - r.n AS lo, js.jobs
	FROM r JOIN js ON js.id = r.worker_id
	WHERE js.jobs = (SELECT js.jobs FROM r JOIN js ON js.id = r.worker_id ORDER BY r.ord LIMIT 1)
), heads AS (
	SELECT l.job_id, hd.priority, hd.seq
	FROM unnest((SELECT jobs FROM g LIMIT 1)) AS l(job_id)
	CROSS JOIN LATERAL (
		` + claimHeadSQL + `
	) hd
), picked AS (
	SELECT c.id, h.priority AS hp, h.seq AS hs, c.priority AS cp, c.seq AS cs
	FROM (SELECT job_id, priority, seq FROM heads ORDER BY priority DESC, seq) h
	CROSS JOIN LATERAL (
		SELECT t.id, t.priority, t.seq ` + fmt.Sprintf(claimPickSQL, "(SELECT sum(n) FROM g)") + `
	) c
	LIMIT (SELECT sum(n) FROM g)
), assigned AS (
	SELECT p.id, g.worker_id FROM (SELECT id, row_number() OVER (ORDER BY hp DESC, hs, cp DESC, cs) - 1 AS k FROM picked) p
	JOIN g ON p.k >= g.lo AND p.k < g.lo + g.n
), u AS (
	UPDATE tasks t SET worker_id = (SELECT a.worker_id FROM assigned a WHERE a.id = t.id), ` + claimSetSQL + `
	WHERE t.id = ANY(ARRAY(SELECT id FROM assigned)) AND ` + hotCountedQual + `
	RETURNING t.*, ` + hotJobReturning + `
)` + fmt.Sprintf(hotOutbox, hotItem("NULL")) + claimCounted + `
SELECT r.worker_id, EXISTS (SELECT 1 FROM g WHERE g.worker_id = r.worker_id), true, ` + hotTaskCols + `, NULL::bigint AS qp, ` + hotNotified + `
FROM r LEFT JOIN (u ` + hotJobOf + ` LEFT JOIN ev ON ev.id = u.id) ON u.worker_id = r.worker_id`

// claimGroupArgs are claimGroupSQL's arguments.
func claimGroupArgs(reqs []ClaimRequest, start bool, n HotNotify) pgx.NamedArgs {
	workers := make([]uuid.UUID, len(reqs))
	users := make([]uuid.UUID, len(reqs))
	limits := make([]int32, len(reqs))
	for i, r := range reqs {
		workers[i], users[i], limits[i] = r.Worker, r.User, int32(r.Limit)
	}
	return n.set(pgx.NamedArgs{"workers": workers, "users": users, "limits": limits, "start": start})
}

// ClaimGroupHot claims for several workers, each for its request's user, in
// one statement (see claimGroupSQL): an answer per request, in order. The
// workers must be distinct.
func (db *DB) ClaimGroupHot(ctx context.Context, reqs []ClaimRequest, start bool, n HotNotify) ([]ClaimAnswer, error) {
	if db.Pool == nil {
		return nil, ErrNoHotPath
	}
	at := make(map[uuid.UUID]int, len(reqs))
	for i, r := range reqs {
		at[r.Worker] = i
	}
	var out []ClaimAnswer
	scan := func(rows pgx.Rows) error {
		out = make([]ClaimAnswer, len(reqs))
		for rows.Next() {
			var (
				worker uuid.UUID
				served bool
				r      claimRow
			)
			if err := rows.Scan(append([]any{&worker, &served}, r.dest()...)...); err != nil {
				return err
			}
			i, ok := at[worker]
			if !ok {
				return fmt.Errorf("group claim: a row for worker %s, which asked nothing", worker)
			}
			out[i].Served = served
			if t, ok := r.task(n); ok {
				out[i].Tasks = append(out[i].Tasks, t)
			}
		}
		return rows.Err()
	}
	if err := db.queryHot(ctx, []any{claimGenericPlanSQL}, claimGroupSQL, claimGroupArgs(reqs, start, n), scan); err != nil {
		return nil, fmt.Errorf("group claim: %w", mapErr(err))
	}
	for _, a := range out {
		slices.SortFunc(a.Tasks, claimOrder)
	}
	return out, nil
}

// submitSQL adds a pending task to the live, non-internal job
// @room:@category:@name (held in key share, so the orphan rule cannot retire
// it meanwhile) when its creator has fewer than @quota pending tasks
// (@quota = 0: no quota; the caller holds the user's quota lock, see
// SubmitTaskHot). The creator's pending bound (migration 170) answers
// that without a count while it is below @quota (the count, an initplan
// under CASE, then never runs); the statement stores the bound plus its
// task, or the count plus its task, or, without a quota, forgets the
// bound. The queue position counts the pending tasks ahead of it over the
// index (the new row is not in the statement's snapshot: hence
// the 1 +). Besides the status event (HotNotify's arguments) it writes
// task_available for the job's workers to the outbox, both in one row when
// they fit (else neither): @av_middle and @av_room_prefix are its item's.
// @timeout is the submission's own task_timeout (NULL: the job's).
// It adds priority 0 tasks that are claimable at once only (a submission
// with a priority or a delay takes the general path): its position counts
// the claimable tasks of a higher priority and those of priority 0 before it.
var submitSQL = `WITH qb AS (
	SELECT CASE WHEN @quota = 0 THEN 0
		WHEN b.bound < @quota THEN b.bound
		ELSE (SELECT count(*) FROM (SELECT 1 FROM tasks q WHERE q.created_by_id = @created_by AND q.status = 'pending' LIMIT @quota) c) END AS have
	FROM (SELECT (SELECT pending_bound FROM users WHERE id = @created_by) AS bound) b
), jj AS (
	SELECT id, task_timeout, heartbeat_timeout FROM jobs WHERE room_id = @room AND category = @category AND name = @name AND deleted = false AND room_id <> '@internal'
		AND (@quota = 0 OR (SELECT have FROM qb) < @quota)
	FOR KEY SHARE
), u AS (
	INSERT INTO tasks (id, job_id, room_id, created_by_id, payload, status, created_at, updated_at, task_timeout, heartbeat_timeout)
	SELECT @id, jj.id, @target_room, @created_by, @payload, 'pending', now(), now(), COALESCE(@timeout::integer, jj.task_timeout), jj.heartbeat_timeout FROM jj WHERE ` + hotCountedQual + `
	RETURNING *
), v AS (
	SELECT u.*, 1 + (SELECT count(*) FROM tasks p WHERE p.job_id = u.job_id AND p.status = 'pending' AND NOT p.delayed AND p.priority = 0 AND p.seq < u.seq)
		+ (SELECT count(*) FROM tasks p WHERE p.job_id = u.job_id AND p.status = 'pending' AND NOT p.delayed AND p.priority > 0) AS position FROM u
), ev AS (
	SELECT u.id, ` + hotItem("u.position") + ` AS p,
		@open || to_json(@av_room_prefix || j.room_id || ':' || j.category || ':' || j.name)::text || @av_middle ||
		json_build_object('job_name', j.room_id || ':' || j.category || ':' || j.name, 'room_id', u.room_id, 'task_id', u.id)::text || @close AS a
	FROM v u JOIN jobs j ON j.id = u.job_id WHERE @channel <> ''
), ob AS (
	INSERT INTO joblib_event_outbox (payload)
	SELECT @head || p || ',' || a || @tail FROM ev WHERE ` + submitFits + ` RETURNING 1
), ub AS (
	UPDATE users SET pending_bound = CASE WHEN @quota = 0 THEN NULL ELSE (SELECT have FROM qb) + 1 END
	WHERE id = @created_by AND EXISTS (SELECT 1 FROM u) AND (@quota > 0 OR pending_bound IS NOT NULL)
	RETURNING 1
)` + fmt.Sprintf(hotCounted, `SELECT status, 1 AS d FROM u`) + `
SELECT ` + hotTaskCols + `, u.position, COALESCE(` + submitFits + `, false)
FROM v u JOIN jobs j ON j.id = u.job_id LEFT JOIN ev ON ev.id = u.id`

// submitFits says whether submitSQL's two events fit in one payload.
const submitFits = `octet_length(ev.p) + octet_length(ev.a) + 1 + ` + hotFrameBytes + ` < @max_bytes`

// AvailableFrame is what the item of the task_available event a submission
// sends to the job's workers takes besides HotNotify's frame.
type AvailableFrame struct {
	Middle string
	// JobRoomPrefix turns a job's full name into its workers' room name.
	JobRoomPrefix string
}

// lockUserSQL is Q.LockUser's quota lock, for pgx.
const lockUserSQL = "SELECT id FROM users WHERE id = $1 FOR NO KEY UPDATE"

// submitArgs are submitSQL's arguments.
func submitArgs(id uuid.UUID, room, category, name, targetRoom string, createdBy uuid.UUID, payload string, timeout *int, quota int, n HotNotify, a AvailableFrame) pgx.NamedArgs {
	return n.set(pgx.NamedArgs{"room": room, "category": category, "name": name, "id": id, "target_room": targetRoom,
		"created_by": createdBy, "payload": payload, "quota": quota, "timeout": timeout,
		"av_middle": a.Middle, "av_room_prefix": a.JobRoomPrefix})
}

// SubmitTaskHot adds a pending task to a live job that is not @internal, in
// one statement, and returns it with its queue position. With quota > 0 the
// task is added only while its creator has fewer than quota pending tasks:
// the user's quota lock (as Q.LockUser takes it) and the statement go as one
// pipeline, one round trip that PostgreSQL runs as one implicit transaction,
// and the statement's snapshot, taken once the lock is granted, counts every
// task a concurrent submission of the same user committed. ok is false when
// no such job exists or the quota is spent (the caller's general path
// answers).
// timeout, when not nil, is the task's own task_timeout in seconds.
func (db *DB) SubmitTaskHot(ctx context.Context, id uuid.UUID, room, category, name, targetRoom string, createdBy uuid.UUID, payload string, timeout *int, quota int, n HotNotify, a AvailableFrame) (HotTask, bool, error) {
	if db.Pool == nil {
		return HotTask{}, false, ErrNoHotPath
	}
	args := submitArgs(id, room, category, name, targetRoom, createdBy, payload, timeout, quota, n, a)
	var t HotTask
	ok := false
	scan := func(rows pgx.Rows) error {
		for rows.Next() {
			var err error
			if t, err = scanHotTask(rows); err != nil {
				return err
			}
			t = n.framed(t)
			ok = true
		}
		return rows.Err()
	}
	var pre []any
	if quota > 0 {
		pre = []any{lockUserSQL, createdBy}
	}
	if err := db.queryHot(ctx, pre, submitSQL, args, scan); err != nil {
		return HotTask{}, false, fmt.Errorf("insert task: %w", mapErr(err))
	}
	return t, ok, nil
}

// HeartbeatHot refreshes the heartbeat of the user's worker in one
// statement. ok is false when the worker is missing or someone else's.
func (db *DB) HeartbeatHot(ctx context.Context, id, userID uuid.UUID) (Worker, bool, error) {
	if db.Pool == nil {
		return Worker{}, false, ErrNoHotPath
	}
	var w Worker
	err := db.Pool.QueryRow(ctx, "UPDATE workers SET last_heartbeat = now() WHERE id = $1 AND user_id = $2 RETURNING "+workerColsBare, id, userID).
		Scan(&w.ID, &w.UserID, &w.LastHeartbeat, &w.CreatedAt, &w.SessionEpoch, &w.NodeID, &w.NodeRun, &w.BoundAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Worker{}, false, nil
	}
	if err != nil {
		return Worker{}, false, fmt.Errorf("heartbeat worker: %w", mapErr(err))
	}
	return w, true, nil
}

// NotifyNow sends one NOTIFY outside any transaction (for a hot statement's
// event that was too large to send inline).
func (db *DB) NotifyNow(ctx context.Context, channel, payload string) error {
	if db.Pool == nil {
		return ErrNoHotPath
	}
	if _, err := db.Pool.Exec(ctx, "SELECT pg_notify($1, $2)", channel, payload); err != nil {
		return fmt.Errorf("notify %s: %w", channel, err)
	}
	return nil
}

// HotUpdate is one status report of a batch (see UpdateTasksHot), by User,
// whose worker must hold the task. Error is stored with a terminal status
// when not empty; Result, when not nil, is the compacted JSON result stored
// with a completion.
type HotUpdate struct {
	ID     uuid.UUID
	User   uuid.UUID
	Status string
	Error  string
	Result *string
}

// updateSQL applies status reports, the rows of b (id, status, err, result,
// by_user), to the tasks that are in a state each may come from
// (@transitions lists the allowed from/to pairs as "from>to"), held by a
// worker of the report's user (by_user: one batch carries the reports of
// many users, each checked against its own), and not the late
// report of a worker a cleanup took them from: the rules of the general
// path, in one statement (a task past its deadline takes no report: the
// sweeper times it out). A report that matches no such task changes nothing
// and is absent from the answer. key is the condition that finds the tasks.
// The conditions on t hold for the row the update changes, also when a
// concurrent change came first (PostgreSQL rechecks them on the newest
// version), and prev_status keeps that row's status for the counts
// (migration 190).
//
// The statement must find its tasks by their primary key in every plan,
// including the generic one PostgreSQL caches after five executions, which
// knows nothing of the parameters: key is the only condition on t that an
// index can serve (a "worker_id IS NOT NULL" can make that plan walk
// tasks_worker_idx over every task any worker ever held), and OFFSET 0
// keeps the owner check a per-row test instead of a join that starts from
// the user's workers and reads all their tasks.
func updateSQL(b, key string) string {
	return `WITH b AS (
	` + b + `
), u AS (
	UPDATE tasks t SET status = b.status, prev_status = t.status, updated_at = now(),
		started_at = CASE WHEN b.status = 'running' THEN now() ELSE t.started_at END,
		completed_at = CASE WHEN b.status IN ('completed', 'failed', 'cancelled') THEN now() ELSE t.completed_at END,
		error = CASE WHEN b.err <> '' THEN b.err ELSE t.error END,
		result = COALESCE(b.result, t.result)
	FROM b
	WHERE ` + key + ` AND t.id = b.id AND (t.status || '>' || b.status) = ANY(@transitions::text[])
		AND (t.lost_worker_id IS NULL OR t.worker_id <> t.lost_worker_id)
		AND (t.deadline_at IS NULL OR t.deadline_at > now()) -- a task past its deadline takes no report
		AND EXISTS (SELECT 1 FROM workers w WHERE w.id = t.worker_id AND w.user_id = b.by_user OFFSET 0)
		-- a failure of a job that retries takes the general path (backoff, errors kept)
		AND (b.status <> 'failed' OR NOT EXISTS (SELECT 1 FROM jobs rj WHERE rj.id = t.job_id AND rj.retry_backoff IS NOT NULL OFFSET 0))
		AND ` + hotCountedQual + `
	RETURNING t.*, ` + hotJobReturning + `
)` + fmt.Sprintf(hotOutbox, hotItem("NULL")) + fmt.Sprintf(hotCounted, `SELECT c.status, c.d FROM u CROSS JOIN LATERAL (VALUES (u.prev_status, -1), (u.status, 1)) c(status, d)`) + `
SELECT ` + hotTaskCols + `, NULL::bigint AS qp, ` + hotNotified + `
FROM u ` + hotJobOf + ` LEFT JOIN ev ON ev.id = u.id`
}

// updateOneSQL is one report (@id, @status, @err, @result, @user): a key
// equality, whose generic plan PostgreSQL keeps (the batch form over arrays
// is planned anew at every execution, which costs a single report more
// than running it).
var updateOneSQL = updateSQL(`SELECT @id::uuid AS id, @status::text AS status, @err::text AS err, @result::text AS result, @user::uuid AS by_user`, "t.id = @id")

// updateBatchSQL is many reports: @ids, @statuses, @errs, @results and
// @users are parallel arrays.
var updateBatchSQL = updateSQL(`SELECT * FROM unnest(@ids::uuid[], @statuses::text[], @errs::text[], @results::text[], @users::uuid[]) AS b(id, status, err, result, by_user)`, "t.id = ANY(@ids::uuid[])")

// updateArgs are the arguments of updateOneSQL (one report) or
// updateBatchSQL (several, which must be in id order), and which of the two.
func updateArgs(ups []HotUpdate, transitions []string, n HotNotify) (string, pgx.NamedArgs) {
	a := n.set(pgx.NamedArgs{"transitions": transitions})
	if len(ups) == 1 {
		u := ups[0]
		a["id"], a["status"], a["err"], a["result"], a["user"] = u.ID, u.Status, u.Error, u.Result, u.User
		return updateOneSQL, a
	}
	ids := make([]uuid.UUID, len(ups))
	statuses := make([]string, len(ups))
	errs := make([]string, len(ups))
	results := make([]*string, len(ups))
	users := make([]uuid.UUID, len(ups))
	for i, u := range ups {
		ids[i], statuses[i], errs[i], results[i], users[i] = u.ID, u.Status, u.Error, u.Result, u.User
	}
	a["ids"], a["statuses"], a["errs"], a["results"], a["users"] = ids, statuses, errs, results, users
	return updateBatchSQL, a
}

// UpdateTasksHot applies status reports in one statement, each by the
// worker of its user, and returns the tasks it changed (in seq order; the reports
// that changed nothing are absent: the caller takes the general path for
// each, which tells the reason). transitions lists the allowed changes as
// "from>to". The ids must be distinct; they are sent in id order, so that
// two batches lock shared rows in the same order. A batch PostgreSQL aborts
// as a deadlock victim changed nothing and comes back empty.
func (db *DB) UpdateTasksHot(ctx context.Context, ups []HotUpdate, transitions []string, n HotNotify) ([]HotTask, error) {
	if db.Pool == nil {
		return nil, ErrNoHotPath
	}
	var pre []any
	if len(ups) > 1 {
		ups = slices.SortedFunc(slices.Values(ups), func(a, b HotUpdate) int { return bytes.Compare(a.ID[:], b.ID[:]) })
		pre = append(pre, genericPlanSQL) // the array form: see genericPlanSQL
	}
	sql, args := updateArgs(ups, transitions, n)
	var out []HotTask
	scan := func(rows pgx.Rows) error {
		for rows.Next() {
			t, err := scanHotTask(rows)
			if err != nil {
				return err
			}
			out = append(out, n.framed(t))
		}
		return rows.Err()
	}
	err := db.queryHot(ctx, pre, sql, args, scan)
	if retryable(err) {
		return nil, nil // a deadlock victim changed nothing: the general path retries each
	}
	if err != nil {
		return nil, fmt.Errorf("update task statuses: %w", mapErr(err))
	}
	slices.SortFunc(out, func(a, b HotTask) int { return cmp.Compare(a.Seq, b.Seq) }) // see claimOrder
	return out, nil
}

// genericPlanSQL makes the statements after it in a pipeline (one implicit
// transaction) run their cached generic plan. PostgreSQL keeps planning a
// prepared statement anew at each execution while its generic plan's
// estimate is costlier than the custom plans': for updateBatchSQL (arrays of
// unknown length, estimated at 10 rows) it always was, and planning that
// statement took 1.1 ms, 60 % of a batch report of two. Its generic plan finds
// the tasks by key like the custom one (TestPlansAtScale).
const genericPlanSQL = "SELECT set_config('plan_cache_mode', 'force_generic_plan', true)"

// claimPlanSQL goes before every claim statement: it plans without sorts.
// The claim order is one index's order (tasks_ready_idx), and with sorts
// disabled only that index can deliver it, whatever the statistics say.
// They may say the queue is empty: taken while it was (a history of
// finished tasks, analysed between two bursts), they make every index on
// pending tasks look empty, and the planner judged a walk over all pending
// tasks in the smallest of them, sorted, as cheap as the index's first
// entries: a claim then read every pending task
// (TestClaimsReadLittleUnderStatisticsOfAnEmptyQueue). The sorts a claim
// cannot do without (its few jobs' heads, the group's hand-out) stay:
// disabling a node type makes it costly, not impossible. That cost is
// PostgreSQL's disable_cost, 10^10 per sort, and a plan that costly is
// compiled by the JIT at each execution (93 functions, 0.6 s per claim):
// so the JIT is off too, which a claim, a few rows, never gains from. Both
// settings are local to the claim's implicit transaction and are the
// planner's: the plan cached with them stays the statement's.
const claimPlanSQL = "SELECT set_config('enable_sort', 'off', true), set_config('jit', 'off', true)"

// claimGenericPlanSQL is claimPlanSQL and genericPlanSQL in one statement.
const claimGenericPlanSQL = "SELECT set_config('enable_sort', 'off', true), set_config('jit', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true)"

// queryHot runs sql with args and hands its rows to scan. A pre statement,
// when given (with its arguments), goes first in the same round trip, as one
// pipeline that PostgreSQL runs as one implicit transaction: a lock the
// statement's snapshot must follow, or genericPlanSQL.
func (db *DB) queryHot(ctx context.Context, pre []any, sql string, named pgx.NamedArgs, scan func(pgx.Rows) error) error {
	sql, args, err := positional(ctx, sql, named)
	if err != nil {
		return err
	}
	if len(pre) == 0 {
		rows, err := db.Pool.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		return scan(rows)
	}
	var b pgx.Batch
	b.Queue(pre[0].(string), pre[1:]...)
	b.Queue(sql, args...).Query(scan)
	return db.Pool.SendBatch(ctx, &b).Close()
}

// positional turns a hot statement with named arguments into its $n form
// and the values in that order. pgx does the same on every call, scanning
// the whole statement text: 8 % of the process's CPU in the contract flow,
// for statements that never change. The rewrite is pgx's own, done once per
// statement text with each name standing for itself, and cached; a
// statement naming an argument it is not given is rewritten on every call,
// as pgx would.
func positional(ctx context.Context, sql string, named pgx.NamedArgs) (string, []any, error) {
	if r, ok := rewrites.Load(sql); ok {
		return r.(rewritten).apply(named)
	}
	probe := make(pgx.NamedArgs, len(named))
	for k := range named {
		probe[k] = argName(k)
	}
	out, order, err := probe.RewriteQuery(ctx, nil, sql, nil)
	if err != nil {
		return "", nil, err
	}
	r := rewritten{sql: out, names: make([]string, len(order))}
	for i, o := range order {
		name, ok := o.(argName)
		if !ok { // a name the caller did not give: nothing to cache
			return named.RewriteQuery(ctx, nil, sql, nil)
		}
		r.names[i] = string(name)
	}
	rewrites.Store(sql, r)
	return r.apply(named)
}

// rewrites caches positional's rewrites by statement text (a handful of
// constant statements).
var rewrites sync.Map

// argName stands for a named argument while positional learns the order.
type argName string

type rewritten struct {
	sql   string
	names []string // the argument of each $n, in order
}

func (r rewritten) apply(named pgx.NamedArgs) (string, []any, error) {
	args := make([]any, len(r.names))
	for i, n := range r.names {
		args[i] = named[n]
	}
	return r.sql, args, nil
}
