"""A worker process that holds a Socket.IO connection bound to its worker id
and does nothing else, so a test can SIGKILL it. Prints "ready" once joined.
Env: JOBLIB_URL, TOKEN, JOB_NAME, WORKER_ID.
"""
import os
import sys
import time

import socketio

sio = socketio.Client(reconnection=False)
sio.connect(os.environ["JOBLIB_URL"], auth={"token": os.environ["TOKEN"]}, transports=["websocket"], wait_timeout=5)
ack = sio.call("join_job_room", {"job_name": os.environ["JOB_NAME"], "worker_id": os.environ["WORKER_ID"]}, timeout=5)
if ack != {"ok": True}:
    sys.exit(f"join refused: {ack}")
print("ready", flush=True)
while True:
    time.sleep(60)
