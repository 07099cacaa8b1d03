#!/usr/bin/env bash
# The long forms of the paused-node fault test (cmd/joblib TestFaultPausedNodes):
# two real `joblib serve` processes on PostgreSQL, lease timeout 3 s, the
# sweeper leader SIGSTOPped for 10 s and then for 40 s. Each run prints its
# figures: SIGSTOP -> the other node leads, SIGSTOP -> the paused node's task
# failed, SIGCONT -> the woken node's worker socket dropped.
#
#   bash bench/faults/run.sh            # 10s and 40s
#   bash bench/faults/run.sh 90s        # any pauses
#
# Needs what scripts/test.sh sets up (PostgreSQL at JOBLIB_TEST_DATABASE_URL,
# the Node test client in server/testdata/node).
set -euo pipefail
cd "$(dirname "$0")/../.."
export JOBLIB_TEST_DATABASE_URL="${JOBLIB_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}"
pauses=("$@")
[ ${#pauses[@]} -gt 0 ] || pauses=(10s 40s)
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for p in "${pauses[@]}"; do
	JOBLIB_FAULT_LEASE="${JOBLIB_FAULT_LEASE:-3s}" JOBLIB_FAULT_PAUSE="$p" \
		go test -count=1 -timeout 10m -run 'TestFaultPausedNodes$' -v ./cmd/joblib/ 2>&1 |
		grep -E 'fault timings|^(--- |FAIL|ok )|faults_e2e_test.go' || true
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
