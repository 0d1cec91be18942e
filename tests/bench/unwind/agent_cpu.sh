#!/usr/bin/env bash
# Agent CPU cost of unwinding: runs strata-server, a 2-thread CPU-bound workload
# (demo_service) and strata-agent at 99 Hz for DURATION seconds per mode, once with each
# --unwind-verify mode (off = every sample unwound fully), and prints the agent's CPU time
# (utime + stime from /proc/PID/stat) as % of one core, with the unwinding counters the
# agent logs at exit (frames walked vs reused).
#
#   tests/bench/unwind/agent_cpu.sh [DURATION_SECONDS] [MODES...]
#   env: SERVER, AGENT, WORKLOAD (binaries), HZ (default 99), PORT (default 17931)
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
duration=${1:-30}
shift || true
modes=("$@")
[ ${#modes[@]} -eq 0 ] && modes=(off boundary full)
SERVER=${SERVER:-$root/build/bin/strata-server}
AGENT=${AGENT:-$root/build/bin/strata-agent}
WORKLOAD=${WORKLOAD:-$root/build/bin/demo_service}
HZ=${HZ:-99}
PORT=${PORT:-17931}
ticks=$(getconf CLK_TCK)
work=$(mktemp -d /tmp/strata-agent-cpu-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

"$SERVER" --listen "127.0.0.1:$PORT" --http "" --data "$work/data" --log-level warn \
  > "$work/server.log" 2>&1 &
pids+=($!)
sleep 1
"$WORKLOAD" --threads 2 > /dev/null 2>&1 &
workload=$!
pids+=($workload)
sleep 1

printf '%-9s %8s %10s %12s %14s %14s\n' mode seconds cpu_s agent_cpu_% frames_walked frames_reused
for mode in "${modes[@]}"; do
  "$AGENT" --server "127.0.0.1:$PORT" --pid "$workload" --frequency "$HZ" --interval 5 \
    --unwind-verify "$mode" --log-level info > "$work/agent-$mode.log" 2>&1 &
  agent=$!
  sleep 2  # start-up (symbol tables, CFI compilation) is not the steady state
  t0=$(cpu_ticks "$agent")
  w0=$(date +%s.%N)
  sleep "$duration"
  t1=$(cpu_ticks "$agent")
  w1=$(date +%s.%N)
  kill -INT "$agent"
  wait "$agent" || true
  walked=$(grep -o '[0-9]* frames walked' "$work/agent-$mode.log" | awk '{print $1}' | tail -1)
  reused=$(grep -o '[0-9]* reused' "$work/agent-$mode.log" | awk '{print $1}' | tail -1)
  awk -v m="$mode" -v t0="$t0" -v t1="$t1" -v w0="$w0" -v w1="$w1" -v hz="$ticks" \
      -v walked="${walked:-?}" -v reused="${reused:-?}" 'BEGIN {
    cpu = (t1 - t0) / hz; wall = w1 - w0;
    printf "%-9s %8.1f %10.2f %12.3f %14s %14s\n", m, wall, cpu, 100 * cpu / wall, walked, reused }'
done
