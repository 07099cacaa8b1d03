"""A provider worker as the Python JobManager runs one: it registers a
filesystem provider over REST, joins its provider room over Socket.IO, and
answers each provider_request by uploading a result with X-Request-Hash.
Prints "ready <provider_id>" once joined and "request <request_id>" per
request it serves. Env: JOBLIB_URL, TOKEN, ROOM.
"""
import json
import os
import sys
import threading
import time

import requests
import socketio

BASE = os.environ["JOBLIB_URL"]
TOKEN = os.environ["TOKEN"]
ROOM = os.environ["ROOM"]
HEADERS = {"Authorization": "Bearer " + TOKEN}

r = requests.put(f"{BASE}/v1/joblib/rooms/{ROOM}/providers", headers=HEADERS, timeout=5,
                 json={"category": "filesystem", "name": "local", "schema": {}})
if r.status_code != 201:
    sys.exit(f"register provider: {r.status_code} {r.text}")
provider = r.json()
full_name = provider["full_name"]

sio = socketio.Client(reconnection=False)


@sio.on("provider_request")
def on_request(data):
    print("request", data["request_id"], flush=True)
    params = json.loads(data["params"])
    # A real provider would read the file system; this one lists a fake directory.
    result = json.dumps([{"name": "file.xyz", "path": params.get("path"), "size": 42}]).encode()

    def upload():
        time.sleep(0.2)  # readers are already long-polling when the result lands
        up = requests.post(f"{BASE}/v1/joblib/providers/{provider['id']}/results", data=result, timeout=5,
                           headers={**HEADERS, "X-Request-Hash": data["request_id"]})
        if up.status_code != 204:
            print("upload failed", up.status_code, up.text, flush=True)

    threading.Thread(target=upload).start()


sio.connect(BASE, auth={"token": TOKEN}, transports=["websocket"], wait_timeout=5)
ack = sio.call("join_provider_room", {"provider_name": full_name, "worker_id": provider["worker_id"]}, timeout=5)
if ack != {"ok": True}:
    sys.exit(f"join refused: {ack}")
print("ready", provider["id"], flush=True)
sio.wait()
