#!/usr/bin/env bash
# Data-parallel launch on MindSpore's own runtime: msrun on this machine, loopback only, bounded in time.
#   bash tools/launch_dp.sh [-n WORKERS] [-t SECONDS] [-l LOG_DIR] script.py [script args...]
# Defaults: 2 workers, 600 s, logs in build/dp_logs. The venv's bin comes first in PATH (msrun starts
# `python` from PATH); the master port is a free loopback port; MS_NODE_TIMEOUT defaults to 180 s (peers
# that arrive later than MindSpore's default 30 s otherwise fail the job). msrun runs in its own process
# group; that group and every process msrun started (each worker has a group of its own) are killed when
# the job ends, when a worker fails (msrun would wait out MS_NODE_TIMEOUT first), when it times out or when
# this script is interrupted: nothing is left behind.
# Exit status: msrun's (non-zero when a worker failed), 124 on timeout. Each worker's output is in
# LOG_DIR/worker_<rank>.log; on failure the last lines of each (MindSpore's log lines left out) are printed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
workers=2 limit=600 logdir="$root/build/dp_logs"
while getopts "n:t:l:" opt; do
  case $opt in
    n) workers=$OPTARG ;; t) limit=$OPTARG ;; l) logdir=$OPTARG ;;
    *) echo "usage: $0 [-n WORKERS] [-t SECONDS] [-l LOG_DIR] script.py [args...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[[ $# -ge 1 ]] || { echo "launch_dp: no script given" >&2; exit 2; }
[[ -f "$1" ]] || { echo "launch_dp: script '$1' not found" >&2; exit 2; }
[[ "$workers" =~ ^[1-9][0-9]*$ ]] || { echo "launch_dp: -n must be a positive integer, got '$workers'" >&2; exit 2; }
[[ "$limit" =~ ^[1-9][0-9]*$ ]] || { echo "launch_dp: -t must be a positive integer, got '$limit'" >&2; exit 2; }
py="$root/.venv/bin/python"
[[ -x "$py" ]] || { echo "launch_dp: $py missing (run bash tools/setup.sh)" >&2; exit 2; }
export PATH="$root/.venv/bin:$PATH"
export MS_NODE_TIMEOUT=${MS_NODE_TIMEOUT:-180}
port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
rm -rf "$logdir" && mkdir -p "$logdir"

setsid timeout -k 10 "$limit" msrun --worker_num="$workers" --local_worker_num="$workers" \
  --master_addr=127.0.0.1 --master_port="$port" --log_dir="$logdir" --join=True "$@" \
  > "$logdir/msrun.log" 2>&1 &
pid=$!
# msrun starts each worker in a process group of its own: remember every descendant while the job runs,
# so that cleanup reaches the workers too (by their ids)
declare -A seen=()
descendants() {
  local p
  for p in $(pgrep -P "$1" 2>/dev/null); do echo "$p"; descendants "$p"; done
}
remember() { local p; for p in $(descendants "$pid"); do seen[$p]=1; done; }
cleanup() {
  remember
  kill -TERM -- "-$pid" "${!seen[@]}" 2>/dev/null; sleep 1
  kill -KILL -- "-$pid" "${!seen[@]}" 2>/dev/null
}
trap 'cleanup; exit 130' INT TERM
# msrun notices a failed worker at once but then waits out MS_NODE_TIMEOUT before it exits: stop it then
rc=
while kill -0 "$pid" 2>/dev/null; do
  remember
  if grep -q "worker exits with exception" "$logdir/msrun.log" 2>/dev/null; then rc=1; break; fi
  sleep 1
done
if [[ -z $rc ]]; then wait "$pid"; rc=$?; fi
cleanup  # whatever msrun left in its group (scheduler, workers of a failed job)
trap - INT TERM
if [[ $rc -ne 0 ]]; then
  echo "launch_dp: msrun exited $rc ($([[ $rc -eq 124 ]] && echo "timed out after ${limit}s" || echo failed))" >&2
  for f in "$logdir"/worker_*.log "$logdir"/scheduler.log; do
    [[ -f "$f" ]] || continue
    echo "--- $f" >&2
    grep -v '^\[\(INFO\|WARNING\|DEBUG\)\]' "$f" | tail -n 25 >&2
  done
fi
exit $rc
