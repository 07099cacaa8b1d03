#!/usr/bin/env bash
# Regenerates the dashboard screenshots of the README and docs/dashboard.md
# (docs/img/dashboard-*.png): the browser test drives a real fleet (a worker
# process, tasks, a failure, a retry, the process killed and reaped) and saves
# what the page shows at each stage. Needs chromium (scripts/test.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
out="$PWD/docs/img"
mkdir -p "$out"
JOBLIB_DASHBOARD_SCREENSHOTS="$out" \
  go test -count=1 ./server -run 'TestDashboardInBrowser/sqlite' -v | grep -E 'screenshot|latency|^(ok|FAIL|---)'
ls -l "$out"/dashboard-*.png
