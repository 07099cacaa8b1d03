#!/usr/bin/env python3
"""A joblib worker in ~150 lines: what the zndraw-joblib client (JobManager)
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
   completed with its result (or failed with the error).
5. On SIGTERM/SIGINT: DELETE /workers/{id} (graceful: nothing left behind).

Environment: JOBLIB_URL (default http://localhost:8080), JOBLIB_TOKEN,
ROOM (default "examples"), WORKER_TIMEOUT seconds (default 60, the server's
JOBLIB_WORKER_TIMEOUT). Prints "ready <worker id>" once serving and
"done <task id>" after each task.
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


def scale(payload):
    """modifiers:Scale multiplies payload["values"] by payload["factor"]."""
    factor = float(payload.get("factor", 1))
    return {"values": [v * factor for v in payload.get("values", [])]}


def summarize(payload):
    """analysis:Summarize returns count, sum and mean of payload["values"]."""
    values = payload.get("values", [])
    return {"count": len(values), "sum": sum(values), "mean": sum(values) / len(values) if values else None}


# category:name -> (JSON schema of the payload, function)
JOBS = {
    ("modifiers", "Scale"): ({"type": "object", "properties": {"values": {"type": "array"}, "factor": {"type": "number"}}}, scale),
    ("analysis", "Summarize"): ({"type": "object", "properties": {"values": {"type": "array"}}}, summarize),
}


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
    call("PATCH", f"/tasks/{tid}", json={"status": "running"})
    try:
        result = full_names[task["job_name"]](task.get("payload") or {})
    except Exception as exc:  # the job failed: report it, keep serving
        call("PATCH", f"/tasks/{tid}", json={"status": "failed", "error": f"{type(exc).__name__}: {exc}"})
    else:
        call("PATCH", f"/tasks/{tid}", json={"status": "completed", "result": result})
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
