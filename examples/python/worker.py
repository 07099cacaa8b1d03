#!/usr/bin/env python3
"""A joblib worker in ~200 lines: what the zndraw-joblib client (JobManager)
does, with python-socketio and requests only.

    pip install "python-socketio[client]" requests   # or: apt install python3-socketio python3-requests
    JOBLIB_CLIENT_URL=http://localhost:8080 JOBLIB_CLIENT_TOKEN=jl_... python3 examples/python/worker.py

Its life, as docs/quickstart.md describes it over curl:
1. POST /v1/joblib/workers                  -> a worker id
2. PUT  /v1/joblib/rooms/{room}/jobs         registers each job for that worker
3. Socket.IO connect (auth {"token"}) and join_job_room for each job: the
   server now keeps the worker's heartbeat fresh while the socket is open,
   and sends task_available when a task is submitted. If the socket drops,
   the worker heartbeats over REST (PATCH /workers/{id}) and reconnects.
4. On task_available (and after each connect): POST /tasks/claim until it
   answers {"task": null}; for each task PATCH running, run the job, PATCH
   completed with its result (or failed with the error). A long job reports
   its progress (the task_progress socket event, acknowledged), which the
   room's UIs see and which keeps a task with a heartbeat_timeout alive.
   When the server ends a task under it (its submitter cancelled it, or it
   passed its timeout), task_cancelled arrives on the socket and the job
   stops at its next step; nothing is reported for it.
5. When the server lost the worker (an operator deleted it, a sweep reaped
   it: a 404 on a join, a claim or a heartbeat), register again, as the Go
   SDK does.
6. On SIGTERM/SIGINT: DELETE /workers/{id} (graceful: nothing left behind)
   and exit within a second, whatever the server answers.

Environment: JOBLIB_CLIENT_URL (default http://localhost:8080; JOBLIB_URL
also works), JOBLIB_CLIENT_TOKEN (or JOBLIB_TOKEN), ROOM (default
"examples"), WORKER_TIMEOUT seconds (default 60, the server's
JOBLIB_WORKER_TIMEOUT). Prints "ready <worker id>" once serving,
"registered <worker id>" after registering again, "done <task id>" after
each task, "cancelled <task id> <reason>" for a task the server ended and
"stopped <worker id>" at the end.
"""
import os
import signal
import sys
import threading
import time

import requests
import socketio

URL = (os.environ.get("JOBLIB_CLIENT_URL") or os.environ.get("JOBLIB_URL") or "http://localhost:8080").rstrip("/")
API = URL + "/v1/joblib"
TOKEN = os.environ.get("JOBLIB_CLIENT_TOKEN") or os.environ.get("JOBLIB_TOKEN")
if not TOKEN:
    sys.exit("set JOBLIB_CLIENT_TOKEN to an API token (joblib token create --user NAME)")
ROOM = os.environ.get("ROOM", "examples")
TIMEOUT = float(os.environ.get("WORKER_TIMEOUT", "60"))

http = requests.Session()
http.headers["Authorization"] = "Bearer " + TOKEN


class Cancelled(Exception):
    """The server ended the task (cancelled, or timed out)."""


class Work:
    """What a job sees of its task: progress reports and the server's stop."""

    def __init__(self, task_id):
        self.task_id = task_id
        self.stop = threading.Event()  # set by task_cancelled
        self.reason = ""

    def progress(self, current, total, message=""):
        body = {"current": current, "total": total, "message": message}
        if sio.connected:
            ack = sio.call("task_progress", {"task_id": self.task_id, **body}, timeout=10)
            refused, detail = (None, "") if ack.get("ok") else (ack.get("status"), ack.get("detail", ""))
        else:
            r = http.patch(f"{API}/tasks/{self.task_id}", json={"progress": body}, timeout=30)
            refused, detail = (r.status_code, r.json().get("detail", "")) if r.status_code >= 400 else (None, "")
        if refused == 409:  # the task ended (or passed its deadline) meanwhile
            raise Cancelled(self.reason or detail)
        if refused:
            print("progress refused:", refused, detail, file=sys.stderr, flush=True)


def scale(payload, work):
    """modifiers:Scale multiplies payload["values"] by payload["factor"]."""
    factor = float(payload.get("factor", 1))
    return {"values": [v * factor for v in payload.get("values", [])]}


def summarize(payload, work):
    """analysis:Summarize returns count, sum and mean of payload["values"]."""
    values = payload.get("values", [])
    return {"count": len(values), "sum": sum(values), "mean": sum(values) / len(values) if values else None}


def sleep(payload, work):
    """modifiers:Sleep works payload["steps"] steps of payload["delay"]
    seconds, reporting its progress after each, and stops as soon as the
    server ends the task."""
    steps, delay = int(payload.get("steps", 10)), float(payload.get("delay", 0.1))
    for i in range(steps):
        work.progress(i, steps, f"step {i + 1} of {steps}")
        if work.stop.wait(delay):
            raise Cancelled(work.reason)
    return {"steps": steps}


# category:name -> (JSON schema of the payload, function)
JOBS = {
    ("modifiers", "Scale"): ({"type": "object", "properties": {"values": {"type": "array"}, "factor": {"type": "number"}}}, scale),
    ("analysis", "Summarize"): ({"type": "object", "properties": {"values": {"type": "array"}}}, summarize),
    ("modifiers", "Sleep"): ({"type": "object", "properties": {"steps": {"type": "integer"}, "delay": {"type": "number"}}}, sleep),
}
running = {}  # task id -> Work of the task being run


class HTTPError(RuntimeError):
    def __init__(self, method, path, status, text):
        super().__init__(f"{method} {path}: {status} {text}")
        self.status = status


def call(method, path, timeout=30, **kw):
    r = http.request(method, API + path, timeout=timeout, **kw)
    if r.status_code >= 400:
        # Errors are RFC 9457 problems: {"type", "title", "status", "detail"}.
        raise HTTPError(method, path, r.status_code, r.text)
    return r.json() if r.content else None


stopping = threading.Event()
claim_lock = threading.Lock()
reg_lock = threading.Lock()
worker_id = None
full_names = {}  # "examples:modifiers:Scale" -> function


def register(stale=None):
    """Create a worker and register every job for it. With stale, only if
    the worker is still that one (another thread may have done it)."""
    global worker_id
    with reg_lock:
        if stopping.is_set() or (stale is not None and worker_id != stale):
            return
        wid = call("POST", "/workers")["id"]
        for (category, name), (schema, fn) in JOBS.items():
            job = call("PUT", f"/rooms/{ROOM}/jobs", json={"category": category, "name": name, "schema": schema, "worker_id": wid})
            full_names[job["full_name"]] = fn
        if stale is not None:
            print("registered", wid, flush=True)
        worker_id = wid


def run_task(task):
    tid = task["id"]
    work = running[tid] = Work(tid)
    try:
        call("PATCH", f"/tasks/{tid}", json={"status": "running"})
        result = full_names[task["job_name"]](task.get("payload") or {}, work)
    except Cancelled as why:  # the server ended it: nothing to report
        print("cancelled", tid, why, flush=True)
        return
    except Exception as exc:  # the job failed: report it, keep serving
        call("PATCH", f"/tasks/{tid}", json={"status": "failed", "error": f"{type(exc).__name__}: {exc}"})
    else:
        call("PATCH", f"/tasks/{tid}", json={"status": "completed", "result": result})
    finally:
        running.pop(tid, None)
    print("done", tid, flush=True)


def drain():
    """Claim and run tasks until none is left (claims are FIFO per worker)."""
    try:
        with claim_lock:
            while not stopping.is_set():
                wid = worker_id
                try:
                    task = call("POST", "/tasks/claim", json={"worker_id": wid})["task"]
                except HTTPError as exc:
                    if exc.status != 404:
                        raise
                    register(stale=wid)  # the server lost the worker
                    continue
                if task is None:
                    return
                run_task(task)
    except Exception as exc:  # keep serving; the next notice claims again
        print("claim:", exc, file=sys.stderr, flush=True)


sio = socketio.Client(reconnection=False)  # the loop at the bottom reconnects


def join_all():
    """Join every job's room; joining binds the worker to this socket. A 404
    means the server lost the worker: register again and join as the new one."""
    for attempt in range(2):
        wid = worker_id
        refused = []
        for name in list(full_names):
            ack = sio.call("join_job_room", {"job_name": name, "worker_id": wid}, timeout=10)
            if not ack.get("ok"):
                refused.append(ack)
        if not refused:
            break
        if attempt == 0 and any(a.get("status") == 404 for a in refused):
            register(stale=wid)
            continue
        print("join refused:", refused, file=sys.stderr, flush=True)
        break
    drain()


@sio.event
def connect():
    # Off the socket's thread: joins wait for acks, and pings must keep flowing.
    threading.Thread(target=join_all, daemon=True).start()


@sio.on("task_available")
def task_available(data):
    threading.Thread(target=drain, daemon=True).start()


def shutdown():
    """DELETE the worker and exit, within a second whatever the server
    answers (404: already gone; or no answer at all). A task still running
    is failed by the server when its worker goes."""
    threading.Timer(0.9, lambda: os._exit(1)).start()
    try:
        call("DELETE", f"/workers/{worker_id}", timeout=0.5)
    except Exception as exc:
        print("delete worker:", exc, file=sys.stderr, flush=True)
    print("stopped", worker_id, flush=True)
    os._exit(0)  # socket threads must not hold the exit


@sio.on("task_cancelled")
def task_cancelled(data):
    # The task's submitter (or an operator) cancelled it, or it passed its
    # timeout: the job stops at its next step.
    work = running.get(data.get("task_id"))
    if work is not None:
        work.reason = data.get("reason", "")
        work.stop.set()


def stop(signum, frame):
    if not stopping.is_set():
        stopping.set()
        threading.Thread(target=shutdown, daemon=True).start()


signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
register()
sio.connect(URL, auth={"token": TOKEN}, transports=["websocket"], wait_timeout=10)
print("ready", worker_id, flush=True)

# Keep the socket open; while it is down, heartbeat over REST every third
# of the worker timeout (the server cannot vouch for us then) and reconnect.
last_beat = time.monotonic()
while not stopping.is_set():
    if not sio.connected:
        if time.monotonic() - last_beat >= TIMEOUT / 3:
            last_beat = time.monotonic()
            wid = worker_id
            try:
                call("PATCH", f"/workers/{wid}", timeout=5)
            except HTTPError as exc:
                if exc.status == 404:
                    register(stale=wid)
                else:
                    print("heartbeat:", exc, file=sys.stderr, flush=True)
            except Exception as exc:
                print("heartbeat:", exc, file=sys.stderr, flush=True)
        try:
            sio.connect(URL, auth={"token": TOKEN}, transports=["websocket"], wait_timeout=5)
        except Exception as exc:
            print("connect:", exc, file=sys.stderr, flush=True)
    stopping.wait(0.5)
threading.Event().wait()  # shutdown() ends the process
