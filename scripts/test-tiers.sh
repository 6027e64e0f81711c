#!/usr/bin/env bash
# The whole suite as `make test` runs it: two tiers at once.
#
#   scripts/test-tiers.sh PROCESSES [PYTEST OPTIONS...]
#
# Most of the suite carries audio in real time (tests/e2e: its servers, peers, browsers and
# `omni-rtc call` runs), and its tests depend on that timing. tests/pipeline/local is the dev
# model's computations and engine processes: CPU work with no clock to keep, and most of the
# suite's CPU. So the real-time tier runs at normal priority and tests/pipeline/local beside it
# at niceness 10, where the kernel gives each of its processes about a tenth of a real-time
# process's share of a busy core: it takes the CPU the real-time tests leave idle, and little of
# what they use. Each tier runs in PROCESSES pytest-xdist processes, a test file each at a time
# (--dist loadfile).
#
# On this 2-core box (2026-12-03/04) one pytest run in 2 processes took 597-637 s; a third
# process took ~490-560 s but starved the real-time tests (a barge-in, a minute-long utterance
# split by a stalled media worker); niceness 10 for everything outside tests/e2e starved the
# `omni-rtc call` test (then in tests/app) in one run of three (its media worker paced 175 of 254
# frames late). The two tiers at once: ~440-530 s, 1,460 passed.
#
# The real-time tier's output streams; the model tier's is printed whole when both are done. The
# exit status is non-zero when either tier failed.
set -uo pipefail
cd "$(dirname "$0")/.."

processes=${1:?"usage: $0 PROCESSES [PYTEST OPTIONS...]"}
shift
pytest=.venv/bin/pytest
model_tier=tests/pipeline/local
model_log=$(mktemp)
model_pid=
cleanup() {
  if [ -n "$model_pid" ]; then kill "$model_pid" 2>/dev/null; fi
  rm -f "$model_log"
}
trap cleanup EXIT

scripts/run-offline.sh nice -n 10 "$pytest" -n "$processes" --dist loadfile "$@" "$model_tier" >"$model_log" 2>&1 &
model_pid=$!
echo "== every test but $model_tier (which runs beside them at niceness 10; its output follows) =="
scripts/run-offline.sh "$pytest" -n "$processes" --dist loadfile --ignore="$model_tier" "$@"
realtime_status=$?
wait "$model_pid"
model_status=$?
model_pid=
echo "== $model_tier =="
cat "$model_log"
echo "== exit status: every test but $model_tier $realtime_status; $model_tier $model_status =="
if [ "$realtime_status" -ne 0 ]; then exit "$realtime_status"; fi
exit "$model_status"
