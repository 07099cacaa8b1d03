// joblib's live dashboard. Everything arrives by push: the page joins the
// dashboard channel over Socket.IO (join_dashboard answers with a snapshot)
// and then renders every dashboard_update the server sends. It never polls;
// between updates it only ages the heartbeats on its own clock.
"use strict";

import { SocketIO } from "./sio.js";

const TOKEN_KEY = "joblib.token";
const API = "/v1/joblib";
const $ = (id) => document.getElementById(id);

let sock = null;
let snap = null; // the latest snapshot
let receivedAt = 0; // performance.now() when it arrived
let room = "";

// --- small DOM helpers (text only: nothing from the server becomes HTML)

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const k of kids.flat()) {
    if (k === undefined || k === null || k === false) continue;
    e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  }
  return e;
}

const short = (id) => (id ? String(id).slice(0, 8) : "");

function dur(ms) {
  if (ms === null || ms === undefined || !isFinite(ms)) return "–";
  const neg = ms < 0;
  ms = Math.abs(ms);
  let s;
  if (ms < 1000) s = Math.round(ms) + " ms";
  else if (ms < 60000) s = (ms / 1000).toFixed(ms < 10000 ? 1 : 0) + " s";
  else if (ms < 3600000) s = Math.floor(ms / 60000) + " min " + Math.round((ms % 60000) / 1000) + " s";
  else if (ms < 86400000) s = Math.floor(ms / 3600000) + " h " + Math.round((ms % 3600000) / 60000) + " min";
  else s = Math.floor(ms / 86400000) + " d";
  return neg ? "-" + s : s;
}

function clock(t) {
  if (!t) return "–";
  const d = new Date(t);
  return d.toISOString().replace("T", " ").replace(/\.(\d{3})Z$/, ".$1Z");
}

// dbNow is the database's clock now: the snapshot's plus the time since it
// arrived (the page's own clock is never compared with the database's).
function dbNow() {
  return Date.parse(snap.db_now) + (performance.now() - receivedAt);
}

// --- state and views

function show(state) {
  document.body.dataset.state = state;
  $("login").hidden = state !== "login";
  $("denied").hidden = state !== "denied";
  $("app").hidden = !(state === "live" || state === "reconnecting");
  $("logout").hidden = state === "login" || state === "loading";
  document.querySelector(".room-pick").hidden = $("app").hidden;
}

function setConn(text, cls) {
  const c = $("conn");
  c.textContent = text;
  c.className = "badge " + (cls || "");
}

function toast(msg, bad) {
  const t = $("toast");
  t.textContent = msg;
  t.className = "toast show" + (bad ? " bad" : "");
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => (t.className = "toast"), 6000);
}

function login(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
  connect(token);
}

function logout(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  if (sock) sock.close();
  sock = null;
  snap = null;
  show("login");
  setConn("logged out");
  $("login-error").textContent = message || "";
  $("token").value = "";
  $("token").focus();
}

function connect(token) {
  if (sock) sock.close();
  setConn("connecting…");
  if (document.body.dataset.state !== "live") show("connecting");
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  sock = new SocketIO(`${proto}//${location.host}/socket.io/?EIO=4&transport=websocket`, { token }, {
    onConnect: () => join(),
    onDisconnect: () => {
      setConn("reconnecting…", "warn");
      if (snap) show("reconnecting");
    },
    onRefused: (msg) => logout(msg === "Unauthorized" ? "The server refused this token (unknown, revoked or expired)." : msg),
    onEvent: (name, args) => {
      if (name === "dashboard_update" && args[0]) apply(args[0]);
    },
  });
  sock.open();
}

async function join() {
  let a;
  try {
    [a] = await sock.emit("join_dashboard", {}, true);
  } catch {
    return; // disconnected meanwhile; the reconnect joins again
  }
  if (!a || !a.ok) {
    if (a && (a.status === 403 || a.status === 401)) {
      sock.close();
      $("denied-text").textContent = a.detail + ". Log in with a superuser's token to see the fleet.";
      setConn("no access", "bad");
      show("denied");
      $("logout").focus();
      return;
    }
    // The server could not read a snapshot (its database?): ask again.
    setConn("unavailable: " + ((a && a.detail) || "no answer") + " — retrying", "bad");
    const s = sock;
    setTimeout(() => {
      if (sock === s && s.connected) join();
    }, 3000);
    return;
  }
  setConn("live", "ok");
  apply(a.dashboard, true);
}

// apply renders a snapshot unless an older one arrives after a newer one.
function apply(d, fresh) {
  if (snap && !fresh && d.node === snap.node && d.seq <= snap.seq) return;
  snap = d;
  receivedAt = performance.now();
  if (document.body.dataset.state !== "live") show("live");
  setConn("live", "ok");
  render();
}

// --- rendering

function inRoom(rooms) {
  return room === "" || rooms.includes(room);
}

function fill(tableId, rows, empty) {
  const tb = $(tableId).tBodies[0];
  const cols = $(tableId).tHead.rows[0].cells.length;
  tb.replaceChildren(...(rows.length ? rows : [el("tr", { class: "empty" }, el("td", { colspan: cols, text: empty }))]));
}

function render() {
  // Keep the keyboard where it was: re-focus the same control after the
  // tables are rebuilt.
  const key = document.activeElement && document.activeElement.dataset ? document.activeElement.dataset.key : undefined;
  renderRooms();
  renderTiles();
  renderTrends();
  renderSweeper();
  renderWorkers();
  renderCleanups();
  renderTasks();
  renderJobs();
  $("where").textContent = `node ${snap.node} · database time ${clock(snap.db_now)}`;
  $("foot").textContent = `snapshot #${snap.seq} read in ${snap.took_ms.toFixed(1)} ms; pushed by the server, never polled.`;
  if (key) {
    const again = document.querySelector(`[data-key="${CSS.escape(key)}"]`);
    if (again) again.focus();
  }
}

function renderRooms() {
  const sel = $("room");
  const have = new Set([...sel.options].map((o) => o.value));
  const want = new Set(["", ...snap.rooms.map((r) => r.room_id)]);
  if (room && !want.has(room)) want.add(room);
  if (have.size !== want.size || [...want].some((r) => !have.has(r))) {
    sel.replaceChildren(...[...want].map((r) => el("option", { value: r, text: r === "" ? "all rooms" : r })));
    sel.value = room;
  }
  fill("rooms", snap.rooms.filter((r) => inRoom([r.room_id])).map((r) =>
    el("tr", { "data-room": r.room_id },
      el("td", { text: r.room_id }), el("td", { class: "n", text: r.jobs }), el("td", { class: "n", text: r.providers }),
      el("td", { class: "n", text: r.workers }), el("td", { class: "n", text: r.tasks.pending || 0 }),
      el("td", { class: "n", text: (r.tasks.running || 0) + (r.tasks.claimed || 0) }),
      el("td", { class: "n" + ((r.tasks.failed || 0) > 0 ? " bad-text" : ""), text: r.tasks.failed || 0 }))), "no rooms yet");
}

function tile(id, label, value, cls) {
  return el("div", { class: "tile " + (cls || ""), id: "tile-" + id },
    el("span", { class: "v", "data-value": value, text: value }), el("span", { class: "l", text: label }));
}

function renderTiles() {
  const t = snap.totals.tasks || {};
  const r = room ? snap.rooms.find((x) => x.room_id === room) : null;
  const rt = r ? r.tasks : null;
  const tiles = [
    tile("workers", r ? "workers in room" : "workers", r ? r.workers : snap.totals.workers),
    tile("jobs", "jobs", r ? r.jobs : snap.totals.jobs),
    tile("providers", "providers", r ? r.providers : snap.totals.providers),
    tile("pending", "pending", (rt || t).pending || 0),
    tile("running", "claimed + running", ((rt || t).running || 0) + ((rt || t).claimed || 0)),
    tile("failed", "failed", (rt || t).failed || 0, ((rt || t).failed || 0) > 0 ? "bad" : ""),
  ];
  if (!r) tiles.push(tile("completed", "completed", t.completed || 0));
  tiles.push(
    tile("false-positives", "false positives (24 h)", snap.totals.false_positives, snap.totals.false_positives > 0 ? "bad" : ""),
    tile("slow-consumers", "slow-consumer drops (this node)", snap.sockets.slow_consumer, snap.sockets.slow_consumer > 0 ? "warn" : ""),
    tile("sockets", "open sockets (this node)", snap.sockets.open),
  );
  $("tiles").replaceChildren(...tiles);
}

// --- trends: one sparkline per series, the last hour per minute (the
// server keeps the ring; the page only draws what was pushed)

const SVG = "http://www.w3.org/2000/svg";

// sparkline draws values (null = nothing that minute) as a polyline
// scaled to the series' own maximum.
function sparkline(values) {
  const w = 180, h = 36, n = values.length;
  const top = Math.max(1, ...values.filter((v) => v !== null));
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.setAttribute("class", "spark");
  svg.setAttribute("aria-hidden", "true");
  let pts = [];
  const flush = () => {
    if (pts.length) {
      const line = document.createElementNS(SVG, "polyline");
      line.setAttribute("points", pts.join(" "));
      svg.append(line);
    }
    pts = [];
  };
  values.forEach((v, i) => {
    if (v === null) return flush();
    const x = n > 1 ? (i / (n - 1)) * w : w;
    pts.push(`${x.toFixed(1)},${(h - 2 - (v / top) * (h - 4)).toFixed(1)}`);
  });
  flush();
  return svg;
}

function trend(id, label, values, fmt, summary) {
  const shown = values.filter((v) => v !== null);
  const last = shown.length ? shown[shown.length - 1] : null;
  return el("figure", { class: "trend", id: "trend-" + id, "data-series": id, "data-points": values.map((v) => (v === null ? "" : v)).join(",") },
    el("figcaption", {}, el("span", { class: "l", text: label }), el("span", { class: "v", text: last === null ? "–" : fmt(last) })),
    sparkline(values),
    el("span", { class: "muted small", text: summary }));
}

function renderTrends() {
  const tr = snap.trends;
  if (!tr || !tr.completed) {
    $("trends").replaceChildren(el("p", { class: "muted", text: "no trends from this server" }));
    return;
  }
  const sum = (a) => a.reduce((x, y) => x + (y || 0), 0);
  const peak = (a) => Math.max(0, ...a.filter((v) => v !== null));
  const ms = (v) => dur(v);
  const figs = [
    trend("completed", "completed / min", tr.completed, String, `${sum(tr.completed)} in the hour`),
    trend("failed", "failed / min", tr.failed, String, `${sum(tr.failed)} in the hour`),
    trend("pending", "pending depth", tr.pending, String, `peak ${peak(tr.pending)}`),
    trend("claim-p50", "claim latency p50", tr.claim_p50_ms, ms, `${sum(tr.claims)} claims on this node`),
    trend("claim-p99", "claim latency p99", tr.claim_p99_ms, ms, `worst ${dur(peak(tr.claim_p99_ms))}`),
  ];
  const paths = Object.keys(tr.cleanups || {}).sort();
  for (const p of paths) {
    figs.push(trend("cleanups-" + p, `cleanups: ${p}`, tr.cleanups[p], String, `${sum(tr.cleanups[p])} in the hour (this node)`));
  }
  if (!paths.length) figs.push(el("figure", { class: "trend", id: "trend-cleanups", "data-series": "cleanups" },
    el("figcaption", {}, el("span", { class: "l", text: "cleanups by path" }), el("span", { class: "v", text: "0" })),
    el("span", { class: "muted small", text: "none in the hour (this node)" })));
  $("trends").replaceChildren(...figs);
}

function renderSweeper() {
  const sw = snap.sweeper;
  const s = snap.settings;
  const dl = $("sweeper");
  const fact = (k, v, cls) => [el("dt", { text: k }), el("dd", { class: cls || "", text: v })];
  const items = [];
  if (!sw.observed) {
    items.push(fact("sweeper", "not running in this process"));
  } else {
    items.push(fact("leader", sw.leading ? `this node (${snap.node})` : `another node (this one, ${snap.node}, follows)`));
    const ls = sw.last_sweep;
    items.push(fact("last sweep", ls ? `${ls.outcome} at ${clock(ls.at)}: ${ls.cleaned} cleaned in ${dur(ls.took_ms)}` : "none yet on this node"));
    items.push(fact("outage guard", sw.outage_guard ? "holding: leadership or the database not steady for one worker timeout" : "off",
      sw.outage_guard ? "warn-text" : ""));
    items.push(fact("blast-radius hold", sw.capped && ls ? `holding: ${ls.stale_workers} of ${ls.total_workers} workers stale (cap ${s.sweep_max_fraction})` :
      s.sweep_max_fraction > 0 ? `off (cap ${s.sweep_max_fraction} of the fleet)` : "cap disabled", sw.capped ? "bad-text" : ""));
    if (sw.error) items.push(fact("last error", sw.error, "bad-text"));
  }
  items.push(fact("worker timeout", dur(s.worker_timeout_ms) + ` · sweep every ${dur(s.sweeper_interval_ms)}`));
  dl.replaceChildren(...items.flat());
  fill("nodes", snap.nodes.map((n) => el("tr", {},
    el("td", {}, n.node_id, n.node_id === snap.node ? el("span", { class: "tag", text: "this" }) : null),
    el("td", { text: n.addr }),
    el("td", { class: n.live ? "ok-text" : "bad-text", text: n.live ? "live" : "lapsed " + clock(n.expires_at) }),
    el("td", { text: clock(n.started_at) }))), "no node leases");
}

function hbAge(w) {
  return dbNow() - Date.parse(w.last_heartbeat);
}

function renderWorkers() {
  const ws = snap.workers.filter((w) => inRoom(w.rooms));
  $("workers-count").textContent = room ? `(${ws.length} in ${room})` :
    snap.totals.workers > snap.workers.length ? `(newest ${snap.workers.length} of ${snap.totals.workers})` : `(${snap.totals.workers})`;
  const timeout = snap.settings.worker_timeout_ms;
  fill("workers", ws.map((w) => {
    const age = hbAge(w);
    return el("tr", { "data-worker-id": w.id },
      el("td", { text: w.owner || "?" }),
      el("td", { class: "mono", title: w.id, text: short(w.id) }),
      el("td", { class: "age " + (age > timeout ? "bad-text" : age > timeout / 2 ? "warn-text" : ""), "data-hb": w.last_heartbeat, text: dur(age) }),
      el("td", { class: "mono", text: w.socket ? short(w.socket) : w.node_run ? "on " + (w.node_id || "?") : "REST only" }),
      el("td", { text: w.node_id || "–" }),
      el("td", { class: "jobs" }, w.jobs.length ? w.jobs.join(", ") : el("span", { class: "muted", text: "none" })),
      el("td", { class: "n", text: w.active_tasks }),
      el("td", {}, el("button", { type: "button", class: "small danger", "data-key": "del:" + w.id,
        "aria-label": `Delete worker ${short(w.id)} of ${w.owner}`,
        onclick: () => confirmAction(`Delete worker ${short(w.id)} of ${w.owner}?`,
          `Its ${w.active_tasks} held task(s) are failed or requeued per their job's policy, its providers are removed, and jobs only it served are deleted.`,
          "Delete worker", () => act("DELETE", `/dashboard/workers/${w.id}`, `Worker ${short(w.id)} deleted`)) }, "Delete")));
  }), room ? "no workers serve this room" : "no workers registered");
}

// ageTick re-renders the heartbeat ages (the page's own clock, no request).
function ageTick() {
  if (!snap || document.hidden) return;
  const timeout = snap.settings.worker_timeout_ms;
  for (const td of document.querySelectorAll("td[data-hb]")) {
    const age = dbNow() - Date.parse(td.dataset.hb);
    td.textContent = dur(age);
    td.className = "age " + (age > timeout ? "bad-text" : age > timeout / 2 ? "warn-text" : "");
  }
}

function renderCleanups() {
  const cc = snap.cleanup_counts || {};
  const parts = Object.keys(cc).sort().map((p) => `${p} ${cc[p]}`);
  $("cleanup-counts").textContent = "Last 24 h: " + (parts.length ? parts.join(" · ") : "no cleanups") +
    `. Ages are judged by the database's clock; threshold is the worker timeout a sweep used.`;
  fill("cleanups", snap.cleanups.map((c) => el("tr", { "data-worker-id": c.worker_id, "data-path": c.path, class: c.shadow ? "shadow" : "" },
    el("td", {}, el("span", { class: "tag path-" + c.path, text: c.path }), c.shadow ? el("span", { class: "tag", text: "plan only (capped)" }) : null),
    el("td", { class: "mono", title: c.worker_id, text: short(c.worker_id) }),
    el("td", { text: c.owner || "?" }),
    el("td", { class: "mono", text: clock(c.last_heartbeat) }),
    el("td", { class: "mono", text: clock(c.db_now) }),
    el("td", { class: "evidence-silence", text: dur(c.silence_ms) }),
    el("td", { text: c.threshold_ms ? dur(c.threshold_ms) : "–" }),
    el("td", { text: `${c.tasks_failed} failed, ${c.tasks_requeued} requeued` }),
    el("td", { class: c.heard_at ? "bad-text" : "", text: c.heard_at ? `false positive: ${c.heard_via} at ${clock(c.heard_at)}` : "no" }))),
  "no cleanups recorded");
  fill("timeouts", (snap.timeouts || []).filter((o) => inRoom([o.room_id])).map((o) => el("tr", { "data-task-id": o.task_id, "data-limit": o.limit },
    el("td", { class: "mono", title: o.task_id, text: short(o.task_id) }),
    el("td", { text: o.job }),
    el("td", { class: "mono", title: o.worker_id || "", text: o.worker_id ? short(o.worker_id) : "–" }),
    el("td", { class: "evidence-limit", text: `${o.limit} ${o.seconds} s` }),
    el("td", { class: "mono", text: clock(o.claimed_at) }),
    el("td", { class: "mono", text: o.progress_at ? clock(o.progress_at) : "none" }),
    el("td", { class: "mono", text: clock(o.deadline_at) }),
    el("td", { class: "mono", text: clock(o.db_now) }),
    el("td", { text: o.outcome + (o.attempt ? ` (attempt ${o.attempt})` : "") }))),
  "no task timed out");
}

// progressCell is a running task's last reported progress as a bar.
function progressCell(t) {
  const p = t.progress;
  if (!p) return el("td", { class: "muted", text: t.status === "running" || t.status === "claimed" ? "–" : "" });
  const frac = p.total > 0 && p.current != null ? Math.max(0, Math.min(1, p.current / p.total)) : null;
  const label = (frac != null ? `${Math.round(frac * 100)} %` : p.current != null ? String(p.current) : "") + (p.message ? ` ${p.message}` : "");
  return el("td", { class: "progress-cell", title: `reported at ${clock(t.progress_at)}` },
    frac != null ? el("progress", { max: "1", value: String(frac), "aria-label": `progress of task ${short(t.id)}` }) : null,
    el("span", { class: "muted", text: " " + label.trim() }));
}

function taskActions(t) {
  if (t.status === "failed") {
    return el("button", { type: "button", class: "small", "data-key": "retry:" + t.id, "aria-label": `Retry task ${short(t.id)}`,
      onclick: () => confirmAction(`Retry task ${short(t.id)}?`, `It goes back to pending on ${t.job_name}, keeping its attempt count (${t.attempt}).`,
        "Retry", () => act("POST", `/dashboard/tasks/${t.id}/retry`, `Task ${short(t.id)} is pending again`)) }, "Retry");
  }
  if (t.status === "pending" || t.status === "claimed" || t.status === "running") {
    const what = t.status === "pending" ? "It will never run; its submitter sees it cancelled."
      : "Its worker is told at once (task_cancelled) and stops; its submitter sees it cancelled.";
    return el("button", { type: "button", class: "small danger", "data-key": "cancel:" + t.id, "aria-label": `Cancel task ${short(t.id)}`,
      onclick: () => confirmAction(`Cancel task ${short(t.id)}?`, what,
        "Cancel task", () => act("POST", `/dashboard/tasks/${t.id}/cancel`, `Task ${short(t.id)} cancelled`)) }, "Cancel");
  }
  return null;
}

function renderTasks() {
  const ts = snap.latest_tasks.filter((t) => inRoom([t.room_id]));
  fill("tasks", ts.map((t) => el("tr", { "data-task-id": t.id, "data-status": t.status },
    el("td", { class: "mono", title: t.id, text: short(t.id) }),
    el("td", { text: t.job_name }),
    el("td", {}, el("span", { class: "status st-" + t.status, text: t.status })),
    progressCell(t),
    el("td", { class: "mono", title: "task_timeout " + (t.task_timeout ?? "none") + " s, heartbeat_timeout " + (t.heartbeat_timeout ?? "none") + " s",
      text: t.deadline_at ? clock(t.deadline_at) : "" }),
    el("td", { class: "n", text: t.attempt }),
    el("td", { class: "err", text: t.error || "" }),
    el("td", {}, taskActions(t)))), room ? "no tasks in this room" : "no tasks yet");
  const fs = snap.failed_tasks.filter((t) => inRoom([t.room_id]));
  $("failed").replaceChildren(...(fs.length ? fs.map((t) => el("li", { "data-task-id": t.id },
    el("span", { class: "mono", text: short(t.id) }), " ", el("span", { text: t.job_name }), " · ",
    el("span", { class: "muted", text: clock(t.completed_at) }), el("br"),
    el("span", { class: "err", text: t.error || "(no error text)" }), " ", taskActions(t))) : [el("li", { class: "muted", text: "no failures" })]));
}

function renderJobs() {
  const js = snap.jobs.filter((j) => inRoom([j.room_id]));
  $("jobs-count").textContent = `(${room ? js.length : snap.totals.jobs})`;
  fill("jobs", js.map((j) => el("tr", { "data-job": j.full_name },
    el("td", { text: j.full_name }), el("td", { class: "n" + (j.workers === 0 ? " warn-text" : ""), text: j.workers }),
    el("td", { class: "n", text: j.pending }), el("td", { class: "n", text: j.active }),
    el("td", { text: j.on_worker_loss + (j.on_worker_loss === "requeue" ? ` (max ${j.max_attempts})` : "") }))), "no jobs");
  const ps = snap.providers.filter((p) => inRoom([p.room_id]));
  $("providers-count").textContent = `(${room ? ps.length : snap.totals.providers})`;
  fill("providers", ps.map((p) => el("tr", {},
    el("td", { text: p.full_name }), el("td", { text: p.owner }), el("td", { class: "mono", title: p.worker_id, text: short(p.worker_id) }))), "no providers");
}

// --- operator actions: a confirmation dialog, then one REST call

function confirmAction(title, text, okLabel, run) {
  const d = $("confirm");
  const key = document.activeElement && document.activeElement.dataset ? document.activeElement.dataset.key : undefined;
  $("confirm-h").textContent = title;
  $("confirm-text").textContent = text;
  $("confirm-ok").textContent = okLabel;
  d.returnValue = "";
  d.onclose = () => {
    // The tables may have been rebuilt meanwhile: find the button again.
    const back = key && document.querySelector(`[data-key="${CSS.escape(key)}"]`);
    (back || $("main")).focus();
    if (d.returnValue === "ok") run();
  };
  d.showModal();
  $("confirm-cancel").focus();
}

async function act(method, path, done) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  let res;
  try {
    res = await fetch(API + path, { method, headers: { Authorization: "Bearer " + token, "Content-Type": "application/json" } });
  } catch (e) {
    toast("Request failed: " + e.message, true);
    return;
  }
  if (res.ok) {
    toast(done);
    return;
  }
  let detail = res.statusText;
  try {
    detail = (await res.json()).detail || detail;
  } catch {
    // not JSON
  }
  toast(`Refused (${res.status}): ${detail}`, true);
}

// --- start

function start() {
  $("login-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const t = $("token").value.trim();
    if (t) login(t);
  });
  $("logout").addEventListener("click", () => logout());
  $("room").addEventListener("change", (ev) => {
    room = ev.target.value;
    if (snap) render();
  });
  setInterval(ageTick, 1000);
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) {
    connect(token);
  } else {
    show("login");
    setConn("logged out");
    $("token").focus();
  }
}

start();
