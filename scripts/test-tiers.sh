#!/usr/bin/env bash
# The whole suite as `make test` runs it: two tiers at once.
#
#   scripts/test-tiers.sh PROCESSES [PYTEST OPTIONS...]
#
# The end-to-end tier (tests/e2e: real servers, peers and browsers) mostly waits on real-time
# audio, and its tests depend on that timing; the tiers below it are CPU work with no clock to
# keep. So tests/e2e runs at normal priority and the rest beside it at niceness 10, where the
# kernel gives each of its processes about a tenth of an end-to-end process's share of a busy
# core: it takes the CPU the end-to-end tests leave idle, and little of what they use. Each tier
# runs in PROCESSES pytest-xdist processes, a test file each at a time (--dist loadfile).
#
# On this 2-core box (2026-12-03): one pytest run in 2 processes took 597-637 s, and its e2e tests
# competed with the unit tests at equal priority; the two tiers at once took 437 s (e2e 431 s,
# the rest 403 s), 1,460 passed. A third process in one run took ~490-560 s but starved the
# real-time tests (a barge-in, a minute-long utterance split by a stalled media worker).
#
# The end-to-end tier's output streams; the other tier's is printed whole when both are done.
# The exit status is non-zero when either tier failed.
set -uo pipefail
cd "$(dirname "$0")/.."

processes=${1:?"usage: $0 PROCESSES [PYTEST OPTIONS...]"}
shift
pytest=.venv/bin/pytest
below_log=$(mktemp)
below_pid=
cleanup() {
  if [ -n "$below_pid" ]; then kill "$below_pid" 2>/dev/null; fi
  rm -f "$below_log"
}
trap cleanup EXIT

scripts/run-offline.sh nice -n 10 "$pytest" -n "$processes" --dist loadfile --ignore=tests/e2e "$@" >"$below_log" 2>&1 &
below_pid=$!
echo "== tests/e2e (the tiers below it run beside it at niceness 10; their output follows) =="
scripts/run-offline.sh "$pytest" -n "$processes" --dist loadfile "$@" tests/e2e
e2e_status=$?
wait "$below_pid"
below_status=$?
below_pid=
echo "== the tiers below tests/e2e =="
cat "$below_log"
echo "== tests/e2e: exit status $e2e_status; the tiers below it: exit status $below_status =="
if [ "$e2e_status" -ne 0 ]; then exit "$e2e_status"; fi
exit "$below_status"
