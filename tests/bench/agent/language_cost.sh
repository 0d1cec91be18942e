#!/usr/bin/env bash
# What the agent pays per sample of a Python or Go target against a C++ one, side by side in one
# run.
#
# Targets, all running at once (so the machine's other load is the same for every agent), each
# profiled by its own strata-agent at HZ (default 499):
#   cpp     demo_service --threads 2 (two busy threads)
#   cpp1    demo_service --threads 1 (one busy thread: about the CPU the Python workload's two
#           threads get under the GIL, so as many samples a second: the anchor of x_cpp1, as
#           cpp is of x_cpp; list them first)
#   cppmix  mixed_work_service: the Go workload's work in C++ (SHA-256 of 16 KiB buffers, a sort,
#           JSON encoded and parsed by reflection), as many functions and leaf addresses as the
#           Go target where the demo has three loops: the anchor of x_mix (list it before go)
#   py      python3.11 running tests/e2e/python/python_workload.py (two busy threads under the
#           GIL), Python frames copied at each sample by the agent's BPF program (as root)
#   py-read the same, --python-capture off: each sample wakes the agent, which reads the
#           frames from the target's memory
#   py10    --python-capture off, --python-read-period-ms 10 (which only paces targets whose
#           samples are not delivered one by one)
#   py-off  the same, --python-frames off (the eval loop's native frames only)
#   go      tests/e2e/golang's workload (BUILD/go/go_workload_plain: two busy goroutines,
#           hashing and sorting, each locked to a thread), Go rules from .gopclntab
#   go-switches  the same with -switches (also an allocating goroutine, most of its CPU on the
#           system stack: its stacks crossed)
#   java    OpenJDK (JAVA, default /usr/bin/java) running tests/workloads/java/JavaWorkload.java
#           (two busy threads: parse, SHA-256, sort), no JVM option; the agent asks it for perf
#           maps (--jvm-perf-map) and steps out of its compiled methods by their frame layouts
#   NAME-base  case NAME with the agent BASE_AGENT (another build, e.g. before a change)
# For each agent: its CPU over a window of SECONDS after a WARMUP (on-CPU ns of all its
# threads, /proc/PID/task/*/schedstat: start-up is not counted), the samples of that window
# (the agent's "stopping: N samples" scaled by the target's CPU in the window against its CPU
# while attached: samples follow the target's CPU time), us of CPU per sample, wake-ups per
# sample (over the agent's life), and for Python agents the stale share and the read delay of the agent's "python:"
# line. The agent's BPF programs run in the sampled processes, not in the agent: the Python
# frame capture at its targets' samples, and with per-CPU events the in-kernel filter at every
# sample of the CPUs (it drops other processes' samples before the kernel copies their stacks,
# and runs the capture for targets). Their runs are timed by the kernel while the run sets
# kernel.bpf_stats_enabled (root); their time at the target's samples per sample (bpf_us: the
# filter's runs at other processes' samples are taken out, see bpf_awk) is added to the
# agent's (total_us). Then each case's total_us against cpp's, cpp1's and cppmix's.
#
#   tests/bench/agent/language_cost.sh [SECONDS=30]
#   env: BUILD (default <repo>/build; binaries in BUILD/bin), PYTHON (default
#        /usr/bin/python3.11), CASES (default "cpp cppmix py py-off"), HZ (default 499),
#        WARMUP (default 5 s), INTERVAL (agent --interval, default 10), LOW_HZ (a second agent per
#        target at this rate, and a second table: the CPU of one more sample, from the two
#        agents' difference), AGENT_ARGS (extra flags for
#        every agent), BASE_AGENT (the agent binary of the -base cases), KEEP=1 (keep the
#        temp dir)
#
# Single runs on whatever machine this is: compare the cases of one run, not runs.
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
seconds=${1:-30}
BUILD=${BUILD:-$root/build}
PYTHON=${PYTHON:-/usr/bin/python3.11}
JAVA=${JAVA:-/usr/bin/java}
CASES=${CASES:-cpp cppmix py py-off}
HZ=${HZ:-499}
WARMUP=${WARMUP:-5}
INTERVAL=${INTERVAL:-10}
LOW_HZ=${LOW_HZ:-}
declare -A low
AGENT_ARGS=${AGENT_ARGS:-}
workload=$root/tests/e2e/python/python_workload.py

for b in "$BUILD/bin/strata-server" "$BUILD/bin/strata-agent" "$BUILD/bin/demo_service" "$PYTHON"; do
  [[ -x "$b" ]] || { echo "language_cost.sh: missing $b (set BUILD, PYTHON)" >&2; exit 2; }
done
if [[ " $CASES " == *" cppmix"* ]]; then
  [[ -x "$BUILD/bin/mixed_work_service" ]] ||
    { echo "language_cost.sh: missing $BUILD/bin/mixed_work_service (protobuf, OpenSSL)" >&2
      exit 2; }
fi
if [[ " $CASES " == *" java"* ]]; then
  [[ -x "$JAVA" && -x "$(dirname "$(readlink -f "$JAVA")")/javac" ]] ||
    { echo "language_cost.sh: missing $JAVA or its javac (default-jdk-headless)" >&2; exit 2; }
fi
if [[ " $CASES " == *" go"* ]]; then
  [[ -x "$BUILD/go/go_workload_plain" ]] ||
    { echo "language_cost.sh: missing $BUILD/go/go_workload_plain (golang-go)" >&2; exit 2; }
fi

work=$(mktemp -d /tmp/strata-language-cost-XXXXXX)
pids=()  # every process this script started
stats_before=
cleanup() {
  local i
  [[ -z "$stats_before" ]] || echo "$stats_before" >/proc/sys/kernel/bpf_stats_enabled
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -TERM "${pids[$i]}" 2>/dev/null || true; done
  wait 2>/dev/null || true
  # What the JVM leaves in /tmp: its perf map and attach socket.
  local jvm=${target[java]:-}
  [[ -z "$jvm" ]] || rm -f "/tmp/perf-$jvm.map" "/tmp/.java_pid$jvm"
  if [[ "${KEEP:-0}" == 1 ]]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# Copies, so a concurrent rebuild cannot change them mid-run.
mkdir -p "$work/bin"
for b in strata-server strata-agent demo_service mixed_work_service; do
  [[ ! -x "$BUILD/bin/$b" ]] || cp "$BUILD/bin/$b" "$work/bin/$b"
done
[[ -z "${BASE_AGENT:-}" ]] || cp "$BASE_AGENT" "$work/bin/strata-agent-base"
if [[ " $CASES " == *" java"* ]]; then
  "$(dirname "$(readlink -f "$JAVA")")/javac" -d "$work/java" \
    "$root/tests/workloads/java/JavaWorkload.java"
fi

declare -A target agent
source "$root/tests/bench/cpu_ns.sh"
# wait_for WHAT TIMEOUT PID LOG PATTERN: until LOG holds PATTERN while PID lives.
wait_for() {
  local deadline=$(($(date +%s) + $2))
  until grep -q -- "$5" "$4" 2>/dev/null; do
    if ! kill -0 "$3" 2>/dev/null || (($(date +%s) >= deadline)); then
      echo "language_cost.sh: no $1 (log $4):" >&2
      tail -20 "$4" >&2
      exit 1
    fi
    sleep 0.1
  done
}

# The kernel times BPF programs while this is set (kept as it was after the run).
if [[ -w /proc/sys/kernel/bpf_stats_enabled ]]; then
  stats_before=$(cat /proc/sys/kernel/bpf_stats_enabled)
  echo 1 >/proc/sys/kernel/bpf_stats_enabled
fi

"$work/bin/strata-server" --listen 127.0.0.1:0 --http "" --data "$work/data" --log-level warn \
  >"$work/server.log" 2>&1 &
pids+=($!)
wait_for "strata-server" 60 "${pids[0]}" "$work/server.log" "ready on port"
port=$(sed -n 's/.*ready on port \([0-9]*\).*/\1/p' "$work/server.log" | head -1)

run_seconds=$((WARMUP + seconds + 120))
for c in $CASES; do
  case ${c%-base} in
    cpp) "$work/bin/demo_service" --threads 2 --seconds "$run_seconds" >"$work/$c.target.log" 2>&1 & ;;
    cpp1) "$work/bin/demo_service" --threads 1 --seconds "$run_seconds" >"$work/$c.target.log" 2>&1 & ;;
    cppmix) "$work/bin/mixed_work_service" --seconds "$run_seconds" \
              >"$work/$c.target.log" 2>&1 & ;;
    py | py-read | py10 | py-off) "$PYTHON" "$workload" "$run_seconds" >"$work/$c.target.log" 2>&1 & ;;
    go) "$BUILD/go/go_workload_plain" -seconds "$run_seconds" >"$work/$c.target.log" 2>&1 & ;;
    go-switches) "$BUILD/go/go_workload_plain" -seconds "$run_seconds" -switches \
                   >"$work/$c.target.log" 2>&1 & ;;
    java) "$JAVA" -cp "$work/java" JavaWorkload "$run_seconds" >"$work/$c.target.log" 2>&1 & ;;
    *) echo "language_cost.sh: unknown case $c" >&2; exit 2 ;;
  esac
  target[$c]=$!
  pids+=($!)
done
for c in $CASES; do wait_for "$c ready" 60 "${target[$c]}" "$work/$c.target.log" "ready"; done
# The Go workload works from its SIGUSR1 on.
for c in $CASES; do [[ ${c%-base} != go* ]] || kill -USR1 "${target[$c]}"; done
declare -A attach_cpu
for c in $CASES; do
  flags=()
  case ${c%-base} in
    py-read) flags=(--python-capture off) ;;
    py10) flags=(--python-capture off --python-read-period-ms 10) ;;
    py-off) flags=(--python-frames off) ;;
    java) flags=(--jvm-perf-map '*') ;;
  esac
  bin=$work/bin/strata-agent
  if [[ $c == *-base ]]; then
    [[ -n "${BASE_AGENT:-}" ]] || { echo "language_cost.sh: case $c needs BASE_AGENT" >&2; exit 2; }
    bin=$work/bin/strata-agent-base
  fi
  # shellcheck disable=SC2086  # AGENT_ARGS is a list of flags
  "$bin" --server "127.0.0.1:$port" --pid "${target[$c]}" --frequency "$HZ" \
    --interval "$INTERVAL" --spool-dir none "${flags[@]}" $AGENT_ARGS >"$work/$c.agent.log" 2>&1 &
  agent[$c]=$!
  pids+=($!)
  if [[ -n "$LOW_HZ" ]]; then  # a second agent on the same target, at the low rate
    # shellcheck disable=SC2086
    "$bin" --server "127.0.0.1:$port" --pid "${target[$c]}" --frequency "$LOW_HZ" \
      --interval "$INTERVAL" --spool-dir none "${flags[@]}" $AGENT_ARGS \
      >"$work/$c.low.agent.log" 2>&1 &
    low[$c]=$!
    pids+=($!)
  fi
done
for c in $CASES; do
  wait_for "$c agent attached" 60 "${agent[$c]}" "$work/$c.agent.log" "profiling pid"
  [[ -z "$LOW_HZ" ]] ||
    wait_for "$c low agent attached" 60 "${low[$c]}" "$work/$c.low.agent.log" "profiling pid"
  attach_cpu[$c]=$(cpu_ns "${target[$c]}")
done
sleep "$WARMUP"
declare -A a0 a1 t0 t1 t_end l0 l1
for c in $CASES; do
  a0[$c]=$(cpu_ns "${agent[$c]}"); t0[$c]=$(cpu_ns "${target[$c]}")
  [[ -z "$LOW_HZ" ]] || l0[$c]=$(cpu_ns "${low[$c]}")
done
sleep "$seconds"
for c in $CASES; do
  a1[$c]=$(cpu_ns "${agent[$c]}"); t1[$c]=$(cpu_ns "${target[$c]}")
  [[ -z "$LOW_HZ" ]] || l1[$c]=$(cpu_ns "${low[$c]}")
done
for c in $CASES; do
  kill -TERM "${agent[$c]}"
  [[ -z "$LOW_HZ" ]] || kill -TERM "${low[$c]}"
  t_end[$c]=$(cpu_ns "${target[$c]}")
done
for c in $CASES; do wait "${agent[$c]}" || true; [[ -z "$LOW_HZ" ]] || wait "${low[$c]}" || true; done

echo "agent CPU per sample, ${seconds} s window after ${WARMUP} s, $HZ Hz, cases run at once"
printf '%-11s %9s %9s %9s %8s %9s %7s %7s %7s %10s %8s %9s\n' case agent_ms samples \
  us/sample bpf_us total_us x_cpp x_cpp1 x_mix wake/smpl stale% delay_ms
# "RUNS NS OTHER" of the agent's BPF programs that run in the sampled processes: the
# in-kernel filter of per-CPU events (which runs the Python capture for targets by a tail
# call: one run) and the Python capture where it runs on its own (per-thread events); NS the
# mean per run; OTHER the runs at other processes' samples (the samples the filter dropped).
program_runs() {
  local other
  other=$(sed -n 's/.*processes dropped (\([0-9]*\) in the kernel).*/\1/p' "$1" | tail -1)
  sed -n 's/.*program: \([0-9]*\) runs, \([0-9]*\) ns each.*/\1 \2/p
          s/.*in-kernel filter: \([0-9]*\) runs, \([0-9]*\) ns each.*/\1 \2/p' "$1" |
    awk -v other="${other:-0}" '{ n += $1; ns += $1 * $2 }
      END { printf "%d %.0f %d\n", n, (n > 0 ? ns / n : 0), other }'
}
# The programs' ns per target sample: their time less that of their runs at other processes'
# samples (a cost of per-CPU sampling whatever the target's language, in place of the kernel's
# stack copies of those samples), each such run costing the cpp agent's mean run (the filter
# alone; without a cpp case, this agent's mean).
# The columns x_cpp, x_cpp1 and x_mix: `total` against the anchors' totals, "A1 A2 A3" in that
# order ("-": no such case, or not run yet).
bpf_awk='function bpf_ns(runs, cpp_run,   r, f) {
    split(runs, r, " ")
    f = cpp_run != "" ? cpp_run : r[2]
    return r[1] * r[2] - r[3] * (f < r[2] ? f : r[2])
  }
  function ratios(total, anchors,   a, i, out) {
    split(anchors, a, " ")
    for (i = 1; i <= 3; i++) {
      out = out sprintf(" %7s", a[i] == "-" ? "-" : sprintf("%.2f", total / a[i]))
    }
    return out
  }'
# The anchors' totals of a table, by case, as ratios() takes them.
declare -A anchor
anchors() { echo "${anchor[cpp]:--} ${anchor[cpp1]:--} ${anchor[cppmix]:--}"; }

cpp_run=
for c in $CASES; do
  log=$work/$c.agent.log
  samples=$(sed -n 's/.*stopping: \([0-9]*\) samples.*/\1/p' "$log" | tail -1)
  wakeups=$(sed -n 's/.*sampling: [0-9]* perf events, \([0-9]*\) wake-ups.*/\1/p' "$log" | tail -1)
  stale=$(sed -n 's/.*python: [0-9]* stacks with [0-9]* Python frames, \([0-9]*\) stale.*/\1/p' "$log" | tail -1)
  delay=$(sed -n 's/.*, \([0-9]*\) reads \([0-9.]*\) ms after their sample.*/\1 \2/p' "$log" | tail -1)
  [[ -z "$delay" || "${delay%% *}" == 0 ]] && delay=- || delay=${delay#* }
  runs=$(program_runs "$log")
  [[ $c == cpp ]] && cpp_run=$(echo "$runs" | awk '{ print $2 }')
  row=$(awk -v a0="${a0[$c]}" -v a1="${a1[$c]}" -v t0="${t0[$c]}" -v t1="${t1[$c]}" \
      -v ta="${attach_cpu[$c]}" -v te="${t_end[$c]}" -v n="${samples:-0}" -v w="${wakeups:-0}" \
      -v s="${stale:-}" -v d="$delay" -v x="$(anchors)" -v c="$c" \
      -v runs="${runs:-0 0 0}" -v cpp_run="$cpp_run" "$bpf_awk"' BEGIN {
    win = n * (t1 - t0) / (te > ta ? te - ta : 1)      # samples of the window
    us = win > 0 ? (a1 - a0) / 1e3 / win : 0
    bpf = n > 0 ? bpf_ns(runs, cpp_run) / 1e3 / n : 0  # the programs: runs over the agent life
    total = us + bpf
    printf "%-11s %9.1f %9d %9.1f %8.1f %9.1f%s %10.2f %8s %9s %.3f\n", c,
      (a1 - a0) / 1e6, win, us, bpf, total, ratios(total, x), w / (n > 0 ? n : 1), \
      s == "" ? "-" : sprintf("%.2f", 100 * s / (n > 0 ? n : 1)), d, total }')
  [[ $c == cpp || $c == cpp1 || $c == cppmix ]] && anchor[$c]=${row##* }
  echo "${row% *}"
  sed -n 's/.*\] \(sampling: .*\)/            \1/p; s/.*\] \(python: .*\)/            \1/p
          s/.*\] \(in-kernel filter: .*\)/            \1/p
          s/.*\] \(python capture: .*\)/            \1/p' "$log"
done
[[ -n "$LOW_HZ" ]] || exit 0
# The slope: what one more sample costs, without what an agent pays whatever its rate
# (intervals, shipping, timers, scans), which the averages above spread over each target's
# samples: a target that gets less CPU has fewer samples to spread them over.
echo
echo "agent CPU per additional sample: agents at $HZ and at $LOW_HZ Hz on the same targets"
printf '%-11s %9s %9s %9s %8s %9s %7s %7s %7s\n' case samples low_smpl slope_us bpf_us \
  total_us x_cpp x_cpp1 x_mix
anchor=()
for c in $CASES; do
  n_hi=$(sed -n 's/.*stopping: \([0-9]*\) samples.*/\1/p' "$work/$c.agent.log" | tail -1)
  n_lo=$(sed -n 's/.*stopping: \([0-9]*\) samples.*/\1/p' "$work/$c.low.agent.log" | tail -1)
  runs=$(program_runs "$work/$c.agent.log")
  row=$(awk -v a0="${a0[$c]}" -v a1="${a1[$c]}" -v l0="${l0[$c]}" -v l1="${l1[$c]}" \
      -v t0="${t0[$c]}" -v t1="${t1[$c]}" -v ta="${attach_cpu[$c]}" -v te="${t_end[$c]}" \
      -v hi="${n_hi:-0}" -v lo="${n_lo:-0}" -v runs="${runs:-0 0 0}" -v x="$(anchors)" \
      -v c="$c" -v cpp_run="$cpp_run" "$bpf_awk"' BEGIN {
    f = (t1 - t0) / (te > ta ? te - ta : 1)            # the part of the samples in the window
    whi = hi * f; wlo = lo * f
    slope = whi > wlo ? ((a1 - a0) - (l1 - l0)) / 1e3 / (whi - wlo) : 0
    bpf = hi > 0 ? bpf_ns(runs, cpp_run) / 1e3 / hi : 0
    total = slope + bpf
    printf "%-11s %9d %9d %9.1f %8.1f %9.1f%s %.3f\n", c, whi, wlo, slope, bpf, total,
      ratios(total, x), total }')
  [[ $c == cpp || $c == cpp1 || $c == cppmix ]] && anchor[$c]=${row##* }
  echo "${row% *}"
done
