// Drives a real joblib server with the real socket.io-client, as the ZnDraw
// frontend and a worker would. Run by server's TestNodeClientFlow with
// JOBLIB_URL, WORKER_TOKEN, UI_TOKEN and TRANSPORTS ("websocket" or "default").
// Exits non-zero with a message on any mismatch.
import { io } from "socket.io-client";
import assert from "node:assert/strict";

const base = process.env.JOBLIB_URL;
const workerToken = process.env.WORKER_TOKEN;
const uiToken = process.env.UI_TOKEN;
const transports = process.env.TRANSPORTS === "websocket" ? ["websocket"] : undefined;
const room = process.env.ROOM;
const TIMEOUT = 5000;

function connect(token) {
  const opts = { auth: { token }, reconnection: false };
  if (transports) opts.transports = transports;
  const socket = io(base, opts);
  const upgraded = new Promise((resolve) => {
    socket.io.on("open", () => socket.io.engine.on("upgrade", () => resolve()));
  });
  return new Promise((resolve, reject) => {
    socket.on("connect", () => resolve({ socket, upgraded }));
    socket.on("connect_error", (err) => reject(new Error("connect_error: " + err.message)));
  });
}

function next(socket, event, pred = () => true) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("timed out waiting for " + event)), TIMEOUT);
    const handler = (payload) => {
      if (!pred(payload)) return;
      clearTimeout(timer);
      socket.off(event, handler);
      resolve(payload);
    };
    socket.on(event, handler);
  });
}

async function rest(token, method, path, body) {
  const res = await fetch(base + "/v1/joblib" + path, {
    method,
    headers: { Authorization: "Bearer " + token, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : null };
}

const bad = io(base, { auth: { token: "jl_wrong" }, reconnection: false, transports });
const refusal = await new Promise((resolve) => bad.on("connect_error", (err) => resolve(err.message)));
assert.equal(refusal, "Unauthorized");
bad.close();

const ui = await connect(uiToken);
const uiAck = await ui.socket.timeout(TIMEOUT).emitWithAck("join_room", { room_id: room });
assert.deepEqual(uiAck, { ok: true });

const invalidated = next(ui.socket, "jobs_invalidate");
const reg = await rest(workerToken, "PUT", `/rooms/${room}/jobs`, { category: "modifiers", name: "NodeJob", schema: {} });
assert.equal(reg.status, 201, JSON.stringify(reg.body));
assert.deepEqual(await invalidated, {});
const jobName = `${room}:modifiers:NodeJob`;
const workerId = reg.body.worker_id;

const worker = await connect(workerToken);
const joinAck = await worker.socket.timeout(TIMEOUT).emitWithAck("join_job_room", { job_name: jobName, worker_id: workerId });
assert.deepEqual(joinAck, { ok: true });
const foreign = await ui.socket.timeout(TIMEOUT).emitWithAck("join_job_room", { job_name: jobName, worker_id: workerId });
assert.equal(foreign.ok, false);
assert.equal(foreign.status, 404);

const available = next(worker.socket, "task_available");
const pending = next(ui.socket, "task_status_event", (p) => p.status === "pending");
const sub = await rest(uiToken, "POST", `/rooms/${room}/tasks/${jobName}`, { payload: { angle: 90 } });
assert.equal(sub.status, 202, JSON.stringify(sub.body));
const taskId = sub.body.id;
assert.deepEqual(await available, { job_name: jobName, room_id: room, task_id: taskId });
const ev = await pending;
assert.deepEqual(Object.keys(ev).sort(), ["completed_at", "created_at", "error", "id", "name", "queue_position", "room_id", "started_at", "status", "worker_id"]);
assert.equal(ev.id, taskId);
assert.equal(ev.name, jobName);
assert.equal(ev.room_id, room);
assert.equal(ev.queue_position, 1);
assert.equal(ev.worker_id, null);
assert.equal(ev.error, null);
assert.match(ev.created_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/);

for (const [status, call] of [
  ["claimed", () => rest(workerToken, "POST", "/tasks/claim", { worker_id: workerId })],
  ["running", () => rest(workerToken, "PATCH", `/tasks/${taskId}`, { status: "running" })],
  ["completed", () => rest(workerToken, "PATCH", `/tasks/${taskId}`, { status: "completed" })],
]) {
  const seen = next(ui.socket, "task_status_event", (p) => p.status === status);
  const r = await call();
  assert.equal(r.status, 200, JSON.stringify(r.body));
  const p = await seen;
  assert.equal(p.id, taskId);
  assert.equal(p.worker_id, workerId);
}

if (!transports) {
  await Promise.race([ui.upgraded, new Promise((_, rej) => setTimeout(() => rej(new Error("no upgrade")), TIMEOUT))]);
  assert.equal(ui.socket.io.engine.transport.name, "websocket");
}
ui.socket.close();
worker.socket.close();
console.log("ok");
