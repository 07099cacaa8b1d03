#!/usr/bin/env python3
"""A joblib worker in ~200 lines: what the zndraw-joblib client (JobManager)
does, with python-socketio and requests only.

    pip install "python-socketio[client]" requests   # or: apt install python3-socketio python3-requests
    JOBLIB_URL=http://localhost:8080 JOBLIB_TOKEN=jl_... python3 examples/python/worker.py

Its life, as docs/quickstart.md describes it over curl:
1. POST /v1/joblib/workers                  -> a worker id
2. PUT  /v1/joblib/rooms/{room}/jobs         registers each job for that worker
3. Socket.IO connect (auth {"token"}) and join_job_room for each job: the
   server now keeps the worker's heartbeat fresh while the socket is open,
   and sends task_available when a task is submitted. If the socket drops,
   the worker heartbeats over REST (PATCH /workers/{id}) until it is back.
4. On task_available (and once at start): POST /tasks/claim until it
   answers {"task": null}; for each task PATCH running, run the job, PATCH
   completed with its result (or failed with the error). A long job reports
   its progress (the task_progress socket event, acknowledged), which the
   room's UIs see and which keeps a task with a heartbeat_timeout alive.
   When the server ends a task under it (its submitter cancelled it, or it
   passed its timeout), task_cancelled arrives on the socket and the job
   stops at its next step; nothing is reported for it.
5. On SIGTERM/SIGINT: DELETE /workers/{id} (graceful: nothing left behind).

Environment: JOBLIB_URL (default http://localhost:8080), JOBLIB_TOKEN,
ROOM (default "examples"), WORKER_TIMEOUT seconds (default 60, the server's
JOBLIB_WORKER_TIMEOUT). Prints "ready <worker id>" once serving,
"done <task id>" after each task and "cancelled <task id> <reason>" for a
task the server ended.
"""
import os
import signal
import sys
import threading

import requests
import socketio

URL = os.environ.get("JOBLIB_URL", "http://localhost:8080").rstrip("/")
API = URL + "/v1/joblib"
TOKEN = os.environ["JOBLIB_TOKEN"]
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


def call(method, path, **kw):
    r = http.request(method, API + path, timeout=30, **kw)
    if r.status_code >= 400:
        # Errors are RFC 9457 problems: {"type", "title", "status", "detail"}.
        raise RuntimeError(f"{method} {path}: {r.status_code} {r.text}")
    return r.json() if r.content else None


worker_id = call("POST", "/workers")["id"]
full_names = {}
for (category, name), (schema, fn) in JOBS.items():
    job = call("PUT", f"/rooms/{ROOM}/jobs", json={"category": category, "name": name, "schema": schema, "worker_id": worker_id})
    full_names[job["full_name"]] = fn  # "examples:modifiers:Scale"

claim_lock = threading.Lock()
stopping = threading.Event()


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
    with claim_lock:
        while not stopping.is_set():
            task = call("POST", "/tasks/claim", json={"worker_id": worker_id})["task"]
            if task is None:
                return
            run_task(task)


sio = socketio.Client(reconnection=True)


@sio.event
def connect():
    # (Re-)join after every connect: joining binds the worker to this socket.
    for name in full_names:
        ack = sio.call("join_job_room", {"job_name": name, "worker_id": worker_id}, timeout=10)
        if not ack.get("ok"):
            print("join refused:", ack, file=sys.stderr, flush=True)
    threading.Thread(target=drain, daemon=True).start()


@sio.on("task_available")
def task_available(data):
    # Runs on the socket's thread: hand the work over so pings keep flowing.
    threading.Thread(target=drain, daemon=True).start()


@sio.on("task_cancelled")
def task_cancelled(data):
    # The task's submitter (or an operator) cancelled it, or it passed its
    # timeout: the job stops at its next step.
    work = running.get(data.get("task_id"))
    if work is not None:
        work.reason = data.get("reason", "")
        work.stop.set()


def rest_heartbeat():
    """While the socket is down the server cannot vouch for us: heartbeat
    over REST every third of the worker timeout."""
    while not stopping.wait(TIMEOUT / 3):
        if not sio.connected:
            try:
                call("PATCH", f"/workers/{worker_id}")
            except Exception as exc:
                print("heartbeat:", exc, file=sys.stderr, flush=True)


def stop(signum, frame):
    stopping.set()


signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
sio.connect(URL, auth={"token": TOKEN}, transports=["websocket"], wait_timeout=10)
threading.Thread(target=rest_heartbeat, daemon=True).start()
print("ready", worker_id, flush=True)
stopping.wait()
with claim_lock:  # let a running task finish its report
    call("DELETE", f"/workers/{worker_id}")
sio.disconnect()
print("stopped", worker_id, flush=True)
