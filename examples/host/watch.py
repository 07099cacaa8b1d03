#!/usr/bin/env python3
"""Watch joblib rooms from a terminal, as the host's UI would: log in at the
host, connect to joblib's Socket.IO with that JWT, join rooms, print events.

    /usr/bin/python3 examples/host/watch.py --host http://localhost --user alice alice

--host is where the host app answers /auth/jwt/login; --joblib is where
joblib's /socket.io/ is (default: the same origin, the proxy's layout 2).
Prints "transport NAME", then "joined ROOM ACK" per room (ACK is joblib's
answer as JSON: {"ok": true}, or {"ok": false, "status": 403, ...} when the
host refuses), then "event NAME PAYLOAD" for every room event, until
interrupted. Needs python3-socketio and python3-requests.
"""
import argparse
import json
import signal
import sys

import requests
import socketio

EVENTS = ["jobs_invalidate", "providers_invalidate", "task_status_event", "provider_result_ready", "room_left"]

ap = argparse.ArgumentParser()
ap.add_argument("--host", required=True, help="the host app's origin (login)")
ap.add_argument("--joblib", help="joblib's origin (default: --host)")
ap.add_argument("--user", required=True, help="user name (the example host's password is the name)")
ap.add_argument("rooms", nargs="+")
args = ap.parse_args()

r = requests.post(args.host.rstrip("/") + "/auth/jwt/login", data={"username": args.user, "password": args.user}, timeout=10)
r.raise_for_status()
token = r.json()["access_token"]

sio = socketio.Client()
for name in EVENTS:
    sio.on(name, (lambda n: lambda data: print("event", n, json.dumps(data), flush=True))(name))


@sio.event
def connect():
    # Rooms do not survive a new connection: join after every connect.
    for room in args.rooms:
        ack = sio.call("join_room", {"room_id": room}, timeout=10)
        print("joined", room, json.dumps(ack), flush=True)


signal.signal(signal.SIGTERM, lambda *_: sio.disconnect())
sio.connect(args.joblib or args.host, auth={"token": token}, wait_timeout=10)
sio.sleep(0.5)  # polling first, then the upgrade to websocket
print("transport", sio.transport(), flush=True)
try:
    sio.wait()
except KeyboardInterrupt:
    sio.disconnect()
sys.exit(0)
