"""Drives a real joblib server with python-socketio's sync Client, as a Python
worker (JobManager) and a UI would. Run by server's TestPythonClientFlow with
JOBLIB_URL, WORKER_TOKEN, UI_TOKEN, ROOM and TRANSPORTS ("websocket" or
"default"). Exits non-zero on any mismatch.
"""
import os
import queue
import sys

import requests
import socketio

BASE = os.environ["JOBLIB_URL"]
WORKER_TOKEN = os.environ["WORKER_TOKEN"]
UI_TOKEN = os.environ["UI_TOKEN"]
ROOM = os.environ["ROOM"]
TRANSPORTS = ["websocket"] if os.environ.get("TRANSPORTS") == "websocket" else None
TIMEOUT = 5


def rest(token, method, path, body=None):
    r = requests.request(method, BASE + "/v1/joblib" + path, json=body,
                         headers={"Authorization": "Bearer " + token}, timeout=TIMEOUT)
    return r.status_code, (r.json() if r.content else None)


def client(token, names):
    sio = socketio.Client(reconnection=False)
    inbox = {n: queue.Queue() for n in names}
    for n in names:
        sio.on(n, (lambda name: lambda data: inbox[name].put(data))(n))
    kwargs = {"auth": {"token": token}, "wait_timeout": TIMEOUT}
    if TRANSPORTS:
        kwargs["transports"] = TRANSPORTS
    sio.connect(BASE, **kwargs)
    return sio, inbox


def next_event(inbox, name, pred=lambda p: True):
    while True:
        p = inbox[name].get(timeout=TIMEOUT)
        if pred(p):
            return p


def main():
    refused = socketio.Client(reconnection=False)
    try:
        refused.connect(BASE, auth={"token": "jl_wrong"}, wait_timeout=TIMEOUT)
        sys.exit("connected with a wrong token")
    except socketio.exceptions.ConnectionError:
        pass

    ui, ui_in = client(UI_TOKEN, ["jobs_invalidate", "task_status_event"])
    assert ui.call("join_room", {"room_id": ROOM}, timeout=TIMEOUT) == {"ok": True}

    st, job = rest(WORKER_TOKEN, "PUT", f"/rooms/{ROOM}/jobs", {"category": "analysis", "name": "PyJob", "schema": {}})
    assert st == 201, (st, job)
    assert next_event(ui_in, "jobs_invalidate") == {}
    job_name = f"{ROOM}:analysis:PyJob"
    worker_id = job["worker_id"]

    worker, w_in = client(WORKER_TOKEN, ["task_available"])
    ack = worker.call("join_job_room", {"job_name": job_name, "worker_id": worker_id}, timeout=TIMEOUT)
    assert ack == {"ok": True}, ack

    st, task = rest(UI_TOKEN, "POST", f"/rooms/{ROOM}/tasks/{job_name}", {"payload": {"value": 42}})
    assert st == 202, (st, task)
    avail = next_event(w_in, "task_available")
    assert avail == {"job_name": job_name, "room_id": ROOM, "task_id": task["id"]}, avail
    ev = next_event(ui_in, "task_status_event", lambda p: p["status"] == "pending")
    assert sorted(ev) == ["completed_at", "created_at", "error", "id", "name", "queue_position",
                          "room_id", "started_at", "status", "worker_id"], ev
    assert ev["id"] == task["id"] and ev["name"] == job_name and ev["queue_position"] == 1, ev

    st, claimed = rest(WORKER_TOKEN, "POST", "/tasks/claim", {"worker_id": worker_id})
    assert st == 200 and claimed["task"]["id"] == task["id"], claimed
    ev = next_event(ui_in, "task_status_event", lambda p: p["status"] == "claimed")
    assert ev["worker_id"] == worker_id, ev
    if TRANSPORTS is None:
        assert ui.transport() == "websocket", ui.transport()
    ui.disconnect()
    worker.disconnect()
    print("ok")


if __name__ == "__main__":
    main()
