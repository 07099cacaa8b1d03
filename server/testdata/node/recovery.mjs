// Connection state recovery with the real socket.io-client. Run by server's
// TestNodeClientRecovery with JOBLIB_URL, UI_TOKEN, WORKER_TOKEN, ROOM, and:
//   RECONNECT_URL  the node the UI reconnects to (default JOBLIB_URL)
//   AWAY_MS        how long the UI stays away after the events (default 0)
//   EXPECT         "recovered" (missed events replayed) or "fresh"
// A UI joins a room and sees one task event; its engine is closed; tasks are
// submitted meanwhile; it reconnects. Recovered: socket.recovered is true and
// every missed event arrives exactly once, in order, each with its offset
// as a trailing string argument. The UI asks for recovery with
// auth.recover = true; a second UI that does not gets no offsets. Fresh: recovered is false and nothing is
// replayed. Either way live events flow afterwards. Prints "ok".
import { io } from "socket.io-client";
import assert from "node:assert/strict";

const base = process.env.JOBLIB_URL;
const reconnectURL = process.env.RECONNECT_URL || base;
const uiToken = process.env.UI_TOKEN;
const workerToken = process.env.WORKER_TOKEN;
const room = process.env.ROOM;
const awayMs = Number(process.env.AWAY_MS || 0);
const expect = process.env.EXPECT;
const MISSED = 6;
const TIMEOUT = 10000;

async function rest(token, method, path, body) {
  const res = await fetch(base + "/v1/joblib" + path, {
    method,
    headers: { Authorization: "Bearer " + token, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : null };
}

const reg = await rest(workerToken, "PUT", `/rooms/${room}/jobs`, { category: "modifiers", name: "Recover", schema: {} });
assert.equal(reg.status, 201, JSON.stringify(reg.body));
const jobName = `${room}:modifiers:Recover`;

async function submit() {
  const r = await rest(uiToken, "POST", `/rooms/${room}/tasks/${jobName}`, { payload: {} });
  assert.equal(r.status, 202, JSON.stringify(r.body));
  return r.body.id;
}

// A UI that asks for recovery, and one that does not (it gets no offsets).
const ui = io(base, { auth: { token: uiToken, recover: true }, transports: ["websocket"], reconnection: false });
const plain = io(base, { auth: { token: uiToken }, transports: ["websocket"], reconnection: false });
const plainArgs = [];
plain.on("task_status_event", (...args) => plainArgs.push(args.length));
// Every pending status event, with the arguments after the payload.
const seen = [];
let wake = () => {};
ui.on("task_status_event", (payload, ...rest) => {
  if (payload.status !== "pending") return;
  seen.push({ id: payload.id, rest });
  wake();
});
function until(pred, what) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("timed out waiting for " + what + "; seen " + JSON.stringify(seen))), TIMEOUT);
    const check = () => {
      if (pred()) {
        clearTimeout(timer);
        wake = () => {};
        resolve();
      }
    };
    wake = check;
    check();
  });
}

await new Promise((resolve, reject) => {
  ui.once("connect", resolve);
  ui.once("connect_error", (err) => reject(new Error("connect_error: " + err.message)));
});
assert.equal(ui.recovered, false);
const firstID = ui.id;
assert.deepEqual(await ui.timeout(TIMEOUT).emitWithAck("join_room", { room_id: room }), { ok: true });
await new Promise((resolve) => (plain.connected ? resolve() : plain.once("connect", resolve)));
assert.deepEqual(await plain.timeout(TIMEOUT).emitWithAck("join_room", { room_id: room }), { ok: true });

const first = await submit();
await until(() => seen.some((e) => e.id === first), "the first event");
assert.equal(seen.length, 1);
assert.equal(seen[0].rest.length, 1, "a room event carries one trailing offset");
assert.equal(typeof seen[0].rest[0], "string");

// An unexpected disconnection: the engine goes away under the socket.
const gone = new Promise((resolve) => ui.once("disconnect", resolve));
ui.io.engine.close();
await gone;

const missed = [];
for (let i = 0; i < MISSED; i++) missed.push(await submit());
if (awayMs > 0) await new Promise((r) => setTimeout(r, awayMs));
// Let the missed events reach every node before reconnecting there.
await new Promise((r) => setTimeout(r, 300));

ui.io.uri = reconnectURL; // a load balancer may send the reconnection to another node
const back = new Promise((resolve, reject) => {
  ui.once("connect", resolve);
  ui.once("connect_error", (err) => reject(new Error("connect_error: " + err.message)));
});
ui.connect();
await back;
assert.equal(String(ui.io.engine.port), new URL(reconnectURL).port, "reconnected to RECONNECT_URL");

if (expect === "recovered") {
  assert.equal(ui.recovered, true, "socket.recovered");
  assert.equal(ui.id, firstID, "the socket id is kept");
  await until(() => seen.length >= 1 + MISSED, "the missed events");
} else {
  assert.equal(ui.recovered, false, "socket.recovered");
  assert.notEqual(ui.id, firstID);
  assert.deepEqual(await ui.timeout(TIMEOUT).emitWithAck("join_room", { room_id: room }), { ok: true });
}

// Live events flow afterwards (in the restored room, or the joined one).
const last = await submit();
await until(() => seen.some((e) => e.id === last), "the live event");
await new Promise((r) => setTimeout(r, 200)); // anything duplicated would show up now

const ids = seen.map((e) => e.id);
const want = expect === "recovered" ? [first, ...missed, last] : [first, last];
assert.deepEqual(ids, want, "exactly once and in order");
const offsets = seen.map((e) => e.rest[0]);
assert.equal(new Set(offsets).size, offsets.length, "offsets are unique");
assert.ok(plainArgs.length >= 2, "the other UI got the events");
assert.ok(plainArgs.every((n) => n === 1), "a UI that did not ask for recovery gets no offset: " + JSON.stringify(plainArgs));
plain.close();
ui.close();
console.log("ok");
