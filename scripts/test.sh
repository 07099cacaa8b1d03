#!/usr/bin/env bash
# The one test command (README, .ci/run). It prepares everything a fresh machine lacks:
# a running PostgreSQL with a `test` database reachable on 127.0.0.1:5432, the Node
# Socket.IO test client (npm ci), Debian's python3-socketio, a NATS server on 127.0.0.1:4222,
# promtool (Debian's prometheus), systemd-analyze, python3-yaml, nginx and caddy for the deploy artefacts,
# python3-fastapi, python3-uvicorn and python3-jwt for the example host app, Debian's chromium
# for the dashboard's browser tests, then runs
# the Go suite with -race (which also builds the static binary of the Dockerfile, deploy/deploy_test.go).
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step says when it began (seconds since the command started): where the time goes.
log() { printf '== %s (at %ds)\n' "$*" "$SECONDS" >&2; }
trap 'log "end, exit status $?"' EXIT

apt_updated=0
apt_install() {
  if [ "$apt_updated" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

: "${JOBLIB_TEST_DATABASE_URL:=postgres://postgres@127.0.0.1:5432/test?sslmode=disable}"
export JOBLIB_TEST_DATABASE_URL

ensure_postgres() {
  if command -v pg_isready >/dev/null 2>&1 && pg_isready -q -h 127.0.0.1 -p 5432; then
    :
  else
    if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
      log "installing PostgreSQL"
      apt_install postgresql postgresql-client
    fi
    ver=$(ls /etc/postgresql | sort -V | tail -n 1)
    hba=/etc/postgresql/$ver/main/pg_hba.conf
    # Tests connect over loopback as postgres without a password.
    if ! grep -q '^host all all 127.0.0.1/32 trust' "$hba"; then
      sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
    fi
    log "starting PostgreSQL $ver"
    pg_ctlcluster --skip-systemctl-redirect "$ver" main start || true
    for _ in $(seq 1 60); do
      pg_isready -q -h 127.0.0.1 -p 5432 && break
      sleep 0.5
    done
    pg_isready -h 127.0.0.1 -p 5432
  fi
  if ! psql -h 127.0.0.1 -U postgres -d test -Atc 'select 1' >/dev/null 2>&1; then
    log "creating database test"
    psql -h 127.0.0.1 -U postgres -d postgres -c 'create database test' >/dev/null
  fi
}

ensure_python_client() {
  if ! /usr/bin/python3 -c 'import socketio, websocket, aiohttp, requests' >/dev/null 2>&1; then
    log "installing Debian's python3-socketio"
    apt_install python3-socketio python3-websocket python3-aiohttp python3-requests
  fi
}

ensure_node_client() {
  if ! command -v npm >/dev/null 2>&1; then
    log "installing Node.js"
    apt_install nodejs npm
  fi
  if [ -f server/testdata/node/package-lock.json ]; then
    log "npm ci (Socket.IO test client)"
    npm ci --prefix server/testdata/node --no-audit --no-fund --loglevel=error >/dev/null
  fi
}

ensure_deploy_tools() {
  # deploy/deploy_test.go: promtool checks and unit-tests the alert rules,
  # systemd-analyze verifies the unit, python3-yaml parses the compose file,
  # nginx -t and caddy validate check the proxy configurations (deploy/nginx,
  # deploy/caddy), and cmd/joblib's proxy test runs nginx in front of two
  # nodes and the example host app (examples/host: FastAPI, uvicorn, PyJWT).
  local want=()
  command -v promtool >/dev/null 2>&1 || want+=(prometheus)
  [ -x /usr/sbin/nginx ] || want+=(nginx)
  [ -x /usr/bin/caddy ] || want+=(caddy)
  /usr/bin/python3 -c 'import fastapi, uvicorn, jwt' >/dev/null 2>&1 || want+=(python3-fastapi python3-uvicorn python3-jwt)
  command -v systemd-analyze >/dev/null 2>&1 || want+=(systemd)
  /usr/bin/python3 -c 'import yaml' >/dev/null 2>&1 || want+=(python3-yaml)
  if [ "${#want[@]}" -gt 0 ]; then
    log "installing ${want[*]}"
    # The tests run nginx and caddy as their own child processes. Their
    # Debian services both want port 80: on a machine with an init system the
    # second would fail to start and fail its package's install. A
    # policy-rc.d that refuses service starts (unless one exists) prevents it.
    local policy=/usr/sbin/policy-rc.d made_policy=0 rc=0
    if [ ! -e "$policy" ]; then
      printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made_policy=1
    fi
    apt_updated=1 # the package lists may be old but suffice for these
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null ||
      { apt_updated=0; apt_install --no-install-recommends "${want[@]}"; } || rc=$?
    [ "$made_policy" = 0 ] || rm -f "$policy"
    return "$rc"
  fi
}

# NATS for the optional NATS event bus tests, on 127.0.0.1:4222.
ensure_nats() {
  if (exec 3<>/dev/tcp/127.0.0.1/4222) 2>/dev/null; then
    return
  fi
  if [ ! -x /usr/sbin/nats-server ]; then
    log "installing Debian's nats-server"
    apt_install nats-server
  fi
  log "starting nats-server on 127.0.0.1:4222"
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- -a 127.0.0.1 -p 4222
  for _ in $(seq 1 40); do
    (exec 3<>/dev/tcp/127.0.0.1/4222) 2>/dev/null && return
    sleep 0.25
  done
  log "nats-server did not come up on 127.0.0.1:4222"
  return 1
}

# Debian's chromium, driven headless by the dashboard's browser tests
# (server/dashboard_browser_test.go); JOBLIB_CHROMIUM may name another binary.
ensure_chromium() {
  if [ -n "${JOBLIB_CHROMIUM:-}" ] || command -v chromium >/dev/null 2>&1; then
    return
  fi
  log "installing Debian's chromium"
  apt_install chromium
}

ensure_postgres
ensure_nats
ensure_python_client
ensure_node_client
ensure_deploy_tools
ensure_chromium

export GOTOOLCHAIN=local
# Every mutant must still point at exactly one place in the code (seconds; the
# mutants themselves run with scripts/mutants.sh before a release).
log "mutants apply"
bash scripts/mutants.sh --check
log "go vet"
go vet ./...
# The Dockerfile's static build, once: it warms the compile cache that the
# end-to-end tests (cmd/joblib) and deploy/deploy_test.go (which runs the
# Dockerfile's exact command) then share, instead of both compiling it cold.
log "static build (CGO_ENABLED=0, as the Dockerfile)"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /dev/null ./cmd/joblib
log "go test -race"
# -race turns on checkptr for every package; in modernc.org/sqlite (C
# translated to Go, all unsafe pointer arithmetic) it costs about 45% of the
# CPU of every SQLite test while finding nothing in joblib's code, which
# keeps it. The race detector itself stays on everywhere. -parallel 6: most
# parallel tests wait on sockets, child processes and timers, not on the CPU;
# the default (GOMAXPROCS, 2 here) left the cores idle half the time, and at
# 4 the suite still used one core of two on average.
# The server tests validate every REST answer against server/openapi.json
# and write how many here (go test hides a passing package's output).
JOBLIB_OPENAPI_REPORT="$(mktemp)"
export JOBLIB_OPENAPI_REPORT
go test -race -gcflags='modernc.org/...=-d=checkptr=0' -timeout 30m -count=1 -parallel 6 ./... "$@"
if [ -s "$JOBLIB_OPENAPI_REPORT" ]; then log "$(cat "$JOBLIB_OPENAPI_REPORT")"; fi
rm -f "$JOBLIB_OPENAPI_REPORT"
