#!/usr/bin/env bash
# Agent CPU cost of unwinding, per --unwind-verify mode and per workload, in one run.
#
# For each workload (a 2-thread CPU-bound demo_service; a 200-frame recursion, where unwinding
# dominates) and each mode (off = every sample unwound fully, boundary, full), runs
# strata-agent at HZ against it for DURATION seconds after a start-up grace period, and reads
# the agent's on-CPU time from /proc/PID/task/*/schedstat (nanoseconds, first field, summed
# over all of the agent's threads) at the start and end of that window -- not /proc/PID/stat,
# whose 10 ms ticks cannot separate the modes. Prints one table row per (workload, mode):
# agent CPU as % of one core, agent CPU ns per sample, and the unwinding counters the agent
# logs at exit (frames walked with rule lookups vs reused from the thread's previous sample).
#
#   tests/bench/unwind/agent_cpu.sh [DURATION_SECONDS] [MODES...]
#   env: SERVER, AGENT (binaries), DEMO (demo_service), DEEP (unwind_workload_deep_recursion),
#        WORKLOADS (default "demo deep"), HZ (default 99), PORT (default 17931),
#        BUILD (default build: where the binaries are looked for)
#
# Samples in the window are estimated from the agent's total (it logs the total at exit,
# start-up included) scaled by window / run time; ns per sample is therefore approximate,
# the CPU % is exact. Other load on the machine shifts both: compare rows of one run.
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
duration=${1:-30}
shift || true
modes=("$@")
[ ${#modes[@]} -eq 0 ] && modes=(off boundary full)
BUILD=${BUILD:-$root/build}
SERVER=${SERVER:-$BUILD/bin/strata-server}
AGENT=${AGENT:-$BUILD/bin/strata-agent}
DEMO=${DEMO:-$BUILD/bin/demo_service}
if [[ -z "${DEEP:-}" ]]; then
  for DEEP in "$BUILD"/bin/unwind_workload_deep_recursion \
              "$BUILD"/tests/workloads/unwind/unwind_workload_deep_recursion; do
    [[ -x "$DEEP" ]] && break
  done
fi
WORKLOADS=${WORKLOADS:-demo deep}
HZ=${HZ:-99}
PORT=${PORT:-17931}
grace=3  # start-up (symbol tables, CFI compilation) is not the steady state
work=$(mktemp -d /tmp/strata-agent-cpu-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

source "$root/tests/bench/cpu_ns.sh"
now_ns() { date +%s%N; }

"$SERVER" --listen "127.0.0.1:$PORT" --http "" --data "$work/data" --log-level warn \
  > "$work/server.log" 2>&1 &
pids+=($!)
sleep 1

printf '%-6s %-9s %7s %9s %11s %9s %12s %12s\n' workload mode seconds samples agent_cpu_% \
  ns/sample walked/smpl reused/smpl
for wl in $WORKLOADS; do
  case "$wl" in
    demo) cmd=("$DEMO" --threads 2) ;;
    deep) cmd=("$DEEP" 100000) ;;
    *) echo "unknown workload $wl (demo, deep)" >&2; exit 2 ;;
  esac
  "${cmd[@]}" > /dev/null 2>&1 &
  workload=$!
  pids+=($workload)
  sleep 1
  for mode in "${modes[@]}"; do
    log="$work/agent-$wl-$mode.log"
    "$AGENT" --server "127.0.0.1:$PORT" --pid "$workload" --frequency "$HZ" --interval 5 \
      --spool-dir "$work/spool" \
      --unwind-verify "$mode" --log-level info > "$log" 2>&1 &
    agent=$!
    s0=$(now_ns)
    sleep "$grace"
    c0=$(cpu_ns "$agent")
    w0=$(now_ns)
    sleep "$duration"
    c1=$(cpu_ns "$agent")
    w1=$(now_ns)
    kill -INT "$agent"
    wait "$agent" || true
    s1=$(now_ns)
    samples=$(grep -o 'stopping: [0-9]* samples' "$log" | awk '{print $2}' | tail -1)
    walked=$(grep -o '[0-9]* frames walked' "$log" | awk '{print $1}' | tail -1)
    reused=$(grep -o '[0-9]* reused' "$log" | awk '{print $1}' | tail -1)
    awk -v wl="$wl" -v m="$mode" -v c0="$c0" -v c1="$c1" -v w0="$w0" -v w1="$w1" \
        -v s0="$s0" -v s1="$s1" -v n="${samples:-0}" -v walked="${walked:-0}" \
        -v reused="${reused:-0}" 'BEGIN {
      cpu = c1 - c0; wall = w1 - w0;
      win = (s1 > s0) ? n * wall / (s1 - s0) : 0;  # samples in the window (estimate)
      per = (win > 0) ? sprintf("%.0f", cpu / win) : "?";
      wps = (n > 0) ? walked / n : 0; rps = (n > 0) ? reused / n : 0;
      printf "%-6s %-9s %7.1f %9d %11.3f %9s %12.1f %12.1f\n", wl, m, wall / 1e9, win,
             100 * cpu / wall, per, wps, rps }'
  done
  kill "$workload" 2>/dev/null || true
  wait "$workload" 2>/dev/null || true
done
