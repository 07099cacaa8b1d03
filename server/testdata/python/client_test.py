"""Drives the Go Socket.IO server (URL in SIO_URL) with python-socketio's sync Client.

Run by server/sio's TestPythonClient with Debian's python3-socketio (5.7.x) under
/usr/bin/python3. It follows the zndraw-socketio conventions: one dict argument per
event, call() answered by exactly one ack argument. Exits non-zero on any failure.
"""
import os
import sys
import threading

import socketio

URL = os.environ["SIO_URL"]
TIMEOUT = 5


def scenario(transports):
    label = transports or ["default"]
    got_auth = threading.Event()
    got_news = threading.Event()
    received = {}

    sio = socketio.Client(reconnection=False)

    @sio.on("auth")
    def on_auth(data):
        received["auth"] = data
        got_auth.set()

    @sio.on("news")
    def on_news(data):
        received["news"] = data
        got_news.set()

    @sio.on("question")
    def on_question(data):
        return {"answer": data["n"] * 2}

    @sio.on("answer")
    def on_answer(data):
        received["answer"] = data

    kwargs = {"auth": {"token": "py"}, "wait_timeout": TIMEOUT}
    if transports:
        kwargs["transports"] = transports
    sio.connect(URL, **kwargs)
    try:
        assert sio.connected, "not connected"
        assert got_auth.wait(TIMEOUT), "no auth event"
        assert received["auth"] == {"token": "py"}, received["auth"]

        payload = {"job": "j1", "n": 3, "nested": {"list": [1, "two", None, True]}}
        res = sio.call("echo", payload, timeout=TIMEOUT)
        assert res == payload, res

        blob = bytes([0, 1, 2, 254, 255])
        res = sio.call("echo", blob, timeout=TIMEOUT)
        assert res == blob, res

        room = "py-room-%s" % "-".join(label)
        assert sio.call("join", room, timeout=TIMEOUT) == "joined"
        assert sio.call("broadcast", (room, {"hello": room}), timeout=TIMEOUT) is True
        assert got_news.wait(TIMEOUT), "no broadcast received"
        assert received["news"] == {"hello": room}, received["news"]

        final = sio.transport()
        want = transports[0] if transports else "websocket"
        assert final == want, "transport %s, want %s" % (final, want)
        print("ok: %s (transport %s)" % (label, final))
    finally:
        sio.disconnect()


def namespaces(transports):
    """"/" and "/admin" multiplexed on one Engine.IO session; a binary ack on
    /admin; an unknown namespace refused."""
    label = transports or ["default"]
    sio = socketio.Client(reconnection=False)
    kwargs = {"auth": {"token": "admin"}, "namespaces": ["/", "/admin"], "wait_timeout": TIMEOUT}
    if transports:
        kwargs["transports"] = transports
    sio.connect(URL, **kwargs)
    try:
        assert sorted(sio.namespaces) == ["/", "/admin"], sio.namespaces
        assert sio.call("whoami", namespace="/admin", timeout=TIMEOUT) == "/admin"
        blob = bytes([9, 8, 7, 0])
        assert sio.call("echo", blob, namespace="/admin", timeout=TIMEOUT) == blob
        assert sio.call("echo", {"ns": "/"}, timeout=TIMEOUT) == {"ns": "/"}
        print("ok: namespaces %s" % label)
    finally:
        sio.disconnect()

    bad = socketio.Client(reconnection=False)
    try:
        bad.connect(URL, namespaces=["/nope"], wait_timeout=TIMEOUT, **({"transports": transports} if transports else {}))
    except socketio.exceptions.ConnectionError as e:
        print("ok: unknown namespace refused (%s)" % e)
    else:
        bad.disconnect()
        raise AssertionError("connected to an unknown namespace")


def main():
    for transports in (["websocket"], None, ["polling"]):
        scenario(transports)
        namespaces(transports)
    return 0


if __name__ == "__main__":
    sys.exit(main())
