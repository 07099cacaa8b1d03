"""A worker process bound to its worker id over python-socketio that prints
every task_cancelled it receives as one JSON line, so a test can check that
the end of a task reaches a real client. Prints "ready" once joined.
Env: JOBLIB_URL, TOKEN, JOB_NAME, WORKER_ID.
"""
import json
import os
import sys
import time

import socketio

sio = socketio.Client(reconnection=False)


@sio.on("task_cancelled")
def task_cancelled(data):
    print("task_cancelled", json.dumps(data, sort_keys=True), flush=True)


sio.connect(os.environ["JOBLIB_URL"], auth={"token": os.environ["TOKEN"]}, transports=["websocket"], wait_timeout=5)
ack = sio.call("join_job_room", {"job_name": os.environ["JOB_NAME"], "worker_id": os.environ["WORKER_ID"]}, timeout=5)
if ack != {"ok": True}:
    sys.exit(f"join refused: {ack}")
print("ready", flush=True)
while True:
    time.sleep(60)
