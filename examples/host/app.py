#!/usr/bin/env python3
"""A minimal host application for joblib, the way ZnDraw is one: it owns the
logins and the rooms, and joblib runs beside it (docs/integration.md).

    apt install python3-fastapi python3-uvicorn python3-jwt
    JWT_SECRET=change-me /usr/bin/python3 examples/host/app.py --port 8000

It does three things:
1. POST /auth/jwt/login (form fields username, password, as fastapi-users'
   login route) answers {"access_token", "token_type": "bearer"}: an HS256 JWT
   shaped like fastapi-users' access tokens (sub = the user's UUID,
   aud = ["fastapi-users:auth"], exp). joblib accepts it when it has the same
   secret (JOBLIB_JWT_SECRET) and audience (JOBLIB_JWT_AUDIENCE).
2. It owns rooms: alice may use room "alice", bob room "bob", both may read
   room "lobby" and nobody writes it.
3. POST /joblib/room-auth answers joblib's question (JOBLIB_ROOM_AUTH_URL):
   body {"user_id", "room_id", "access": "read"|"write"} with the caller's
   Authorization: Bearer token; 204 allows, 403 refuses, 404 means no such
   room (joblib refuses too). Anything else, or no answer within
   JOBLIB_ROOM_AUTH_TIMEOUT, is an outage (joblib answers 503 by default).

GET / serves a small page (ui.html) that logs in and shows a room's live
events from joblib. GET /healthz answers {"ok": true}. Passwords are the
user names: this is an example, not a user database.
"""
import argparse
import os
import pathlib
import time
import uuid
from urllib.parse import parse_qs

import jwt
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import FileResponse, JSONResponse

SECRET = os.environ.get("JWT_SECRET", "")
AUDIENCE = ["fastapi-users:auth"]  # fastapi-users' default audience
LIFETIME = int(os.environ.get("JWT_LIFETIME_SECONDS", "3600"))
# The UI's way to joblib: "" = this origin (layout 2: the proxy sends
# /v1/joblib/ and /socket.io/ to joblib), or joblib's own origin (layout 1).
JOBLIB_PUBLIC_URL = os.environ.get("JOBLIB_PUBLIC_URL", "")

USERS = {  # name -> id; fixed so that the example's ids are stable
    "alice": uuid.UUID("a11ce000-0000-4000-8000-000000000001"),
    "bob": uuid.UUID("b0b00000-0000-4000-8000-000000000002"),
}
# room -> {user name: "read" | "write"}; write implies read.
ROOMS = {
    "alice": {"alice": "write"},
    "bob": {"bob": "write"},
    "lobby": {"alice": "read", "bob": "read"},
}

app = FastAPI(title="joblib example host")


def issue(user_id: uuid.UUID) -> str:
    now = int(time.time())
    return jwt.encode({"sub": str(user_id), "aud": AUDIENCE, "exp": now + LIFETIME}, SECRET, algorithm="HS256")


def bearer_user(request: Request):
    """The user id of a valid token of ours in Authorization, else None."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        return None
    try:
        claims = jwt.decode(token, SECRET, algorithms=["HS256"], audience=AUDIENCE)
        return uuid.UUID(claims["sub"])
    except (jwt.InvalidTokenError, KeyError, ValueError):
        return None


@app.post("/auth/jwt/login")
async def login(request: Request):
    # fastapi-users takes an OAuth2 password form; parsed here by hand so
    # that the example needs no python3-multipart.
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    name = form.get("username", [""])[0]
    if name not in USERS or form.get("password", [""])[0] != name:
        return JSONResponse({"detail": "LOGIN_BAD_CREDENTIALS"}, status_code=400)
    return {"access_token": issue(USERS[name]), "token_type": "bearer"}


@app.post("/joblib/room-auth")
async def room_auth(request: Request):
    """joblib asks before a room is used; see docs/authentication.md#room-access."""
    caller = bearer_user(request)
    if caller is None:
        return Response(status_code=401)
    body = await request.json()
    # joblib sends the user it resolved from the same token: a mismatch means
    # the token is not the one this user holds.
    if body.get("user_id") != str(caller):
        return Response(status_code=403)
    members = ROOMS.get(body.get("room_id"))
    if members is None:
        return Response(status_code=404)
    name = next(n for n, i in USERS.items() if i == caller)
    granted = members.get(name)
    if granted == "write" or (granted == "read" and body.get("access") == "read"):
        return Response(status_code=204)
    return Response(status_code=403)


@app.get("/healthz")
async def healthz():
    return {"ok": True}


@app.get("/config.json")
async def config():
    return {"joblib_url": JOBLIB_PUBLIC_URL}


HERE = pathlib.Path(__file__).resolve().parent


@app.get("/")
async def index():
    return FileResponse(HERE / "ui.html")


@app.get("/room.js")
async def room_js():
    # The room-watching logic of the browser example, shared.
    return FileResponse(HERE.parent / "browser" / "room.js", media_type="text/javascript")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    args = ap.parse_args()
    if not SECRET:
        raise SystemExit("JWT_SECRET is required (the same value as joblib's JOBLIB_JWT_SECRET)")
    # proxy_headers: behind nginx/Caddy, trust X-Forwarded-For from loopback.
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", proxy_headers=True)
