#!/usr/bin/env bash
# Agent overhead against `perf record --call-graph dwarf`, side by side, in one run.
#
# Cases (each on the same target process(es), first with strata-agent, then with perf record,
# at the same rate, sampling the same event: cpu-clock, user mode only):
#   a  demo_service --threads 2, 99 Hz
#   b  demo_service --threads 2 --idle-threads 500 (502 target threads, 500 blocked), 99 Hz
#   c  50 demo_service processes (--threads 2 each) at once, 99 Hz (agent: one --pid per
#      process; perf: -p pid1,pid2,...)
#   d  demo_service --threads 2, 999 Hz
#   e  target slowdown: requests/s of `demo_service --threads 2 --fixed-work` alone, under
#      the agent and under perf record (99 Hz), interleaved runs, median of each; and the
#      demo's own CPU time per request (sampling interrupts included, VM steal time excluded).
#      A slowdown far below the host's round-to-round noise is measured at higher rates
#      (SLOWDOWN_HZ="999 4999"): the cost per sample does not depend on the rate, so the
#      slowdown at 99 Hz is the one at N Hz times 99 / N
#   f  kernel stacks and off-CPU on the demo (99 Hz): the agent with --kernel-stacks off, on,
#      and on with --off-cpu, against perf record -e cpu-clock (user and kernel)
#   g  off-CPU of a lock-heavy workload (blocking_service --mode lock-heavy, LOCK_THREADS
#      threads): the agent with and without --off-cpu, against perf record -e
#      context-switches -c 1 (every switch, as the agent's off-CPU events); then the agent's
#      switch-outs per second, intervals counted, and bytes per batch of each profile type
#
# For a-d, per tool: CPU as % of one core over a measured window after a warm-up (on-CPU ns
# from /proc/PID/task/*/schedstat, first field, summed over all of the tool's threads at the
# start and end of the window), VmRSS and VmHWM (peak) at the end of the window, open file
# descriptors, samples (agent: "stopping: N samples" of its log; perf: its "(N samples)" line)
# and samples/s over the time the tool was attached; then the ratio agent/perf. The window
# starts WARMUP seconds after the tool has attached (agent: its "profiling pid" log lines;
# perf: its perf_event descriptors are open). Threads that exit during a window are not
# counted (schedstat of live tasks); neither tool's sampling threads exit. Under each case,
# the agent's threads by name over the same window: CPU (µs/s) and times scheduled in per
# second (wake-ups, and returns from preemption).
#
#   tests/bench/agent/overhead.sh [SECONDS=20]     (measured window of each case of a-d)
#   env: BUILD (default <repo>/build; binaries in BUILD/bin), SERVER, AGENT, DEMO (binaries),
#        PERF (default perf), CASES (default "a b c d e"), WARMUP (default 5 s),
#        INTERVAL (agent --interval, default 10 = the agent's default), AGENT_ARGS (extra
#        agent flags, e.g. "--sampling per-thread"), PERF_STACK (perf's dwarf stack dump,
#        default 8192 = perf's default; the agent copies 16 KiB by default), PROCS (case c,
#        default 50), IDLE (case b, default 500), ROUNDS (case e, default 5), RUN_SECONDS (case
#        e, measured seconds per run, default 10, after WARMUP), PAIRS (cases a-d: agent/perf
#        pairs run, default 1; more print each pair, the medians and the ratio of the medians),
#        SLOWDOWN_HZ (case e's rates, default 99; one table per rate), LOCK_THREADS (case g,
#        default 4), BLOCKING (binary, case g), KEEP=1 (keep the temp dir)
#
# The binaries are copied into the temp dir first, so a concurrent rebuild cannot change them
# mid-run. Figures are single runs on whatever machine this is (other load moves them):
# compare the two tools of one case, and cases of one run. perf's own CPU moves with the cost
# of its file writes more than the agent's does: PAIRS > 1 gives the spread and the medians.
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
seconds=${1:-20}
BUILD=${BUILD:-$root/build}
SERVER=${SERVER:-$BUILD/bin/strata-server}
AGENT=${AGENT:-$BUILD/bin/strata-agent}
DEMO=${DEMO:-$BUILD/bin/demo_service}
BLOCKING=${BLOCKING:-$BUILD/bin/blocking_service}
PERF=${PERF:-perf}
CASES=${CASES:-a b c d e f g}
WARMUP=${WARMUP:-5}
INTERVAL=${INTERVAL:-10}
AGENT_ARGS=${AGENT_ARGS:-}
PERF_STACK=${PERF_STACK:-8192}
PROCS=${PROCS:-50}
IDLE=${IDLE:-500}
ROUNDS=${ROUNDS:-5}
SLOWDOWN_HZ=${SLOWDOWN_HZ:-99}
RUN_SECONDS=${RUN_SECONDS:-10}
PAIRS=${PAIRS:-1}
LOCK_THREADS=${LOCK_THREADS:-4}
PERF_EVENT=cpu-clock:u  # what perf record samples (case f: cpu-clock, user and kernel)
PERF_EXTRA=()           # more perf record flags (case g: -c 1)

for b in "$SERVER" "$AGENT" "$DEMO" "$BLOCKING"; do
  [[ -x "$b" ]] || { echo "overhead.sh: missing binary $b (set BUILD, SERVER, AGENT, DEMO)" >&2; exit 2; }
done
command -v "$PERF" >/dev/null || { echo "overhead.sh: no '$PERF' (apt-get install linux-perf)" >&2; exit 2; }
"$DEMO" --fixed-work --idle-threads 0 --seconds 0.01 >/dev/null 2>&1 ||
  { echo "overhead.sh: $DEMO lacks --fixed-work/--idle-threads (rebuild demo_service)" >&2; exit 2; }

work=$(mktemp -d /tmp/strata-agent-overhead-XXXXXX)
pids=()  # every process this script started
napper=  # the current nap's sleep
cleanup() {
  local i
  [[ -z "$napper" ]] || kill "$napper" 2>/dev/null || true
  # Newest first: tools, then targets, then the server (an agent flushes to it at exit).
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -INT "${pids[$i]}" 2>/dev/null || true
    [[ "${pids[$i]}" == "${server:-}" ]] || wait "${pids[$i]}" 2>/dev/null || true
  done
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  if [[ "${KEEP:-0}" == 1 ]]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$work/bin"
cp "$SERVER" "$work/bin/strata-server"
cp "$AGENT" "$work/bin/strata-agent"
cp "$DEMO" "$work/bin/demo_service"
cp "$BLOCKING" "$work/bin/blocking_service"
SERVER=$work/bin/strata-server AGENT=$work/bin/strata-agent DEMO=$work/bin/demo_service
BLOCKING=$work/bin/blocking_service

source "$root/tests/bench/cpu_ns.sh"
# Per thread of the process: tid, name, on-CPU ns, times it was scheduled in (a wake-up or a
# return from preemption).
thread_stats() {
  local t
  for t in /proc/"$1"/task/*; do
    echo "${t##*/} $(tr ' ' _ <"$t/comm" 2>/dev/null) $(cat "$t/schedstat" 2>/dev/null)"
  done | awk 'NF == 5 {print $1, $2, $3, $5}'
}
now_ns() { date +%s%N; }
nap() { sleep "$1" & napper=$!; wait "$napper"; }  # a trapped INT/TERM interrupts it at once
status_kib() { awk -v k="$2:" '$1 == k {print $2}' /proc/"$1"/status 2>/dev/null || echo 0; }
fds() { { find /proc/"$1"/fd -mindepth 1 2>/dev/null || true; } | wc -l; }
perf_fds() { { find /proc/"$1"/fd -mindepth 1 -lname '*perf_event*' 2>/dev/null || true; } | wc -l; }

# wait_for DESCRIPTION TIMEOUT_SECONDS PID_THAT_MUST_LIVE LOG COMMAND...: polls COMMAND.
wait_for() {
  local what=$1 timeout=$2 pid=$3 log=$4
  shift 4
  local deadline=$(($(date +%s) + timeout))
  until "$@"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "overhead.sh: process $pid exited while waiting for $what; its log:" >&2
      tail -20 "$log" >&2
      exit 1
    fi
    if (($(date +%s) >= deadline)); then
      echo "overhead.sh: timed out after ${timeout}s waiting for $what; log $log:" >&2
      tail -20 "$log" >&2
      exit 1
    fi
    sleep 0.1
  done
}
count_at_least() { [[ $(grep -c -- "$2" "$1" 2>/dev/null || true) -ge $3 ]]; }
has_perf_fds() { [[ $(perf_fds "$1") -gt 0 ]]; }
forget() {  # drop a finished process from the cleanup list
  local p keep=()
  for p in "${pids[@]}"; do [[ "$p" == "$1" ]] || keep+=("$p"); done
  pids=("${keep[@]}")
}
stop() {  # stop SIGNAL PID...: signal and reap
  local sig=$1 p
  shift
  for p in "$@"; do kill "-$sig" "$p" 2>/dev/null || true; done
  for p in "$@"; do wait "$p" 2>/dev/null || true; forget "$p"; done
}

"$SERVER" --listen 127.0.0.1:0 --http "" --data "$work/data" --log-level warn \
  >"$work/server.log" 2>&1 &
server=$!
pids+=("$server")
wait_for "strata-server" 60 "$server" "$work/server.log" count_at_least "$work/server.log" "ready on port" 1
port=$(sed -n 's/.*ready on port \([0-9]*\).*/\1/p' "$work/server.log" | head -1)

# start_demos N ARGS...: starts N demo_service processes, waits until all are ready; sets
# `targets` (their pids).
targets=()
start_demos() {
  local n=$1 i p
  shift
  targets=()
  for ((i = 0; i < n; i++)); do
    "$DEMO" "$@" >"$work/demo-$i.log" 2>&1 &
    p=$!
    pids+=("$p")
    targets+=("$p")
  done
  for ((i = 0; i < n; i++)); do
    wait_for "demo_service ready" 180 "${targets[$i]}" "$work/demo-$i.log" \
      count_at_least "$work/demo-$i.log" "ready" 1
  done
}

# Starts the agent on `targets` at HZ; sets `tool` (its pid) and `tool_log`.
start_agent() {
  local hz=$1 name=$2 p args=()
  for p in "${targets[@]}"; do args+=(--pid "$p"); done
  tool_log=$work/agent-$name.log
  # shellcheck disable=SC2086  # AGENT_ARGS is a list of flags
  "$AGENT" --server "127.0.0.1:$port" "${args[@]}" --frequency "$hz" --interval "$INTERVAL" \
    --spool-dir "$work/spool-$name" --log-level info $AGENT_ARGS >"$tool_log" 2>&1 &
  tool=$!
  pids+=("$tool")
  wait_for "agent attached to ${#targets[@]} processes" 120 "$tool" "$tool_log" \
    count_at_least "$tool_log" "profiling pid" "${#targets[@]}"
}

# Starts perf record on `targets` at HZ; sets `tool` and `tool_log`.
start_perf() {
  local hz=$1 name=$2 list
  list=$(IFS=,; echo "${targets[*]}")
  tool_log=$work/perf-$name.log
  local rate=(-F "$hz")
  ((${#PERF_EXTRA[@]})) && rate=("${PERF_EXTRA[@]}")
  "$PERF" record -e "$PERF_EVENT" "${rate[@]}" --call-graph "dwarf,$PERF_STACK" -p "$list" \
    -o "$work/perf-$name.data" >"$tool_log" 2>&1 &
  tool=$!
  pids+=("$tool")
  wait_for "perf record attached" 120 "$tool" "$tool_log" has_perf_fds "$tool"
}

# measure_tool KIND HZ NAME: runs the tool on `targets`, measures; sets `result` to
# "cpu_pct rss_mib hwm_mib fds samples samples_per_s lost". (No $(...) around it: processes
# it starts must stay in this shell's cleanup list.)
measure_tool() {
  local kind=$1 hz=$2 name=$3 a0 c0 w0 c1 w1 rss hwm nfd a1 samples lost
  "start_$kind" "$hz" "$name"
  a0=$(now_ns)
  nap "$WARMUP"
  c0=$(cpu_ns "$tool"); w0=$(now_ns)
  thread_stats "$tool" >"$work/threads0-$kind-$name"
  nap "$seconds"
  c1=$(cpu_ns "$tool"); w1=$(now_ns)
  thread_stats "$tool" >"$work/threads1-$kind-$name"
  echo $(((w1 - w0))) >"$work/window-$kind-$name"
  if ! kill -0 "$tool" 2>/dev/null; then
    echo "overhead.sh: $kind exited during the window of case $name; its log:" >&2
    tail -20 "$tool_log" >&2
    exit 1
  fi
  rss=$(status_kib "$tool" VmRSS); hwm=$(status_kib "$tool" VmHWM); nfd=$(fds "$tool")
  a1=$(now_ns)
  stop INT "$tool"
  if [[ $kind == agent ]]; then
    samples=$(sed -n 's/.*stopping: \([0-9]*\) samples.* \([0-9]*\) lost.*/\1/p' "$tool_log" | tail -1)
    lost=$(sed -n 's/.*stopping: \([0-9]*\) samples.* \([0-9]*\) lost.*/\2/p' "$tool_log" | tail -1)
  else
    samples=$(sed -n 's/.*(\([0-9]*\) samples).*/\1/p' "$tool_log" | tail -1)
    lost=$(sed -n 's/.*lost \([0-9]*\) chunks.*/\1/p' "$tool_log" | awk '{s += $1} END {print s + 0}')
    rm -f "$work/perf-$name.data"
  fi
  result=$(awk -v c0="$c0" -v c1="$c1" -v w0="$w0" -v w1="$w1" -v rss="$rss" -v hwm="$hwm" -v fd="$nfd" \
      -v n="${samples:-0}" -v a0="$a0" -v a1="$a1" -v lost="${lost:-0}" 'BEGIN {
    printf "%.3f %.1f %.1f %d %d %.1f %d\n", 100 * (c1 - c0) / (w1 - w0), rss / 1024, hwm / 1024,
      fd, n, n / ((a1 - a0) / 1e9), lost }')
}

# pair_rows LABEL AGENT_RESULT PERF_RESULT: the three table rows of one agent/perf pair.
pair_rows() {
  awk -v label="$1" -v ra="$2" -v rp="$3" 'BEGIN {
    split(ra, a, " "); split(rp, p, " ")
    f = "%-30s %-10s %9.3f %9.1f %9.1f %6d %9d %9.1f %6d\n"
    printf f, label, "agent", a[1], a[2], a[3], a[4], a[5], a[6], a[7]
    printf f, "", "perf", p[1], p[2], p[3], p[4], p[5], p[6], p[7]
    printf "%-30s %-10s %8sx %8sx %8sx %5sx %8sx\n", "", "agent/perf", q(a[1], p[1]), q(a[2], p[2]),
      q(a[3], p[3]), q(a[4], p[4]), q(a[5], p[5])
  }
  function q(x, y) { return y > 0 ? sprintf("%.2f", x / y) : "-" }'
}

# One case: both tools on the same targets, PAIRS times (agent first in odd pairs, perf first
# in even ones, so that a drift of the machine's load favours neither); prints three table
# rows per pair and, with more than one pair, the field-wise medians and the ratio of the
# medians. Saves the agent's and perf's (median) results in res_<case>_agent / res_<case>_perf.
declare -A res
run_case() {
  local id=$1 label=$2 hz=$3 k name ra rp ras=() rps=()
  for ((k = 1; k <= PAIRS; k++)); do
    name=$id
    ((PAIRS > 1)) && name=$id$k
    if ((k % 2 == 1)); then
      measure_tool agent "$hz" "$name"; ra=$result
      measure_tool perf "$hz" "$name"; rp=$result
    else
      measure_tool perf "$hz" "$name"; rp=$result
      measure_tool agent "$hz" "$name"; ra=$result
    fi
    ras+=("$ra") rps+=("$rp")
    if ((PAIRS > 1)); then
      pair_rows "$label ($k/$PAIRS)" "$ra" "$rp"
    else
      pair_rows "$label" "$ra" "$rp"
    fi
    agent_details "$name"
  done
  if ((PAIRS > 1)); then
    ra=$(printf '%s\n' "${ras[@]}" | field_medians)
    rp=$(printf '%s\n' "${rps[@]}" | field_medians)
    pair_rows "$label (median)" "$ra" "$rp"
    paste -d' ' <(printf '%s\n' "${ras[@]}" | cut -d' ' -f1) \
      <(printf '%s\n' "${rps[@]}" | cut -d' ' -f1) |
      awk '{r = $2 > 0 ? $1 / $2 : 0; lo = NR == 1 || r < lo ? r : lo; hi = r > hi ? r : hi}
           END {printf "  cpu agent/perf per pair: %.2fx to %.2fx\n", lo, hi}'
  fi
  res[${id}_agent]=$ra res[${id}_perf]=$rp
}

# Lines of numbers in, one line out: the median of each column (the lower middle of an even
# count).
field_medians() {
  local rows i n out=()
  rows=$(cat)
  n=$(head -1 <<<"$rows" | wc -w)
  for ((i = 1; i <= n; i++)); do
    out+=("$(cut -d' ' -f"$i" <<<"$rows" | sort -g |
      awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')")
  done
  echo "${out[*]}"
}

# agent_details NAME: the agent's own account of its sampling and its threads over the window
# of run NAME.
agent_details() {
  local id=$1
  # The agent's own account of its sampling (events, wake-ups, samples of others dropped).
  sed -n 's/.*\] \(sampling: .*\)/  agent \1/p' "$work/agent-$id.log" | tail -1
  # The agent's threads, by name (threads of one name summed): CPU and times scheduled in.
  awk -v ns="$(cat "$work/window-agent-$id")" '
    NR == FNR {cpu0[$1] = $3; in0[$1] = $4; next}
    ($1 in cpu0) {cpu[$2] += $3 - cpu0[$1]; ins[$2] += $4 - in0[$1]}
    END {
      for (n in cpu) if (cpu[n] > 0) printf "%.0f %s %.1f\n", cpu[n] / ns * 1e6, n, ins[n] / ns * 1e9
    }' "$work/threads0-agent-$id" "$work/threads1-agent-$id" | sort -rn |
    awk '{line = line sprintf(" %s %s %s,", $2, $1, $3)}
         END {sub(/,$/, "", line); print "  agent threads (us/s, scheduled in /s):" line}'
}

run_slowdown() {
  local hz=$1 r i mode order pid line tool_pid
  local -A rps cpu
  echo
  echo "e: target slowdown: demo_service --threads 2 --fixed-work, requests/s over ${RUN_SECONDS} s"
  echo "   after a ${WARMUP} s warm-up (the tool attaches during it), $hz Hz; $ROUNDS interleaved"
  echo "   rounds of (alone, agent, perf), the order rotating each round. Also the demo's own CPU"
  echo "   time per request (us): it includes the sampling interrupts and stack copies the kernel"
  echo "   charges to the target, and neither a VM's steal time nor the tool's competition for the"
  echo "   cores, so it shows the cost inside the target without the host's noise"
  printf '%-7s %12s %12s %12s %14s %14s %14s\n' round alone agent perf cpu_us_alone cpu_us_agent \
    cpu_us_perf
  local total
  total=$(awk -v w="$WARMUP" -v s="$RUN_SECONDS" 'BEGIN {print w + s}')
  for ((r = 1; r <= ROUNDS; r++)); do
    case $(((r - 1) % 3)) in
      0) order="none agent perf" ;;
      1) order="agent perf none" ;;
      *) order="perf none agent" ;;
    esac
    for mode in $order; do
      start_demos 1 --threads 2 --fixed-work --warmup "$WARMUP" --seconds "$total"
      pid=${targets[0]}
      tool_pid=
      case $mode in
        agent) start_agent "$hz" "e$r"; tool_pid=$tool ;;
        perf) start_perf "$hz" "e$r"; tool_pid=$tool ;;
      esac
      wait "$pid" || true
      forget "$pid"
      [[ -n "$tool_pid" ]] && stop INT "$tool_pid"
      rm -f "$work"/perf-e*.data
      line=$(grep 'demo_service done:' "$work/demo-0.log" || true)
      rps[$mode.$r]=$(sed -n 's/.*requests_per_second=\([0-9.]*\).*/\1/p' <<<"$line")
      cpu[$mode.$r]=$(sed -n 's/.*cpu_us_per_request=\([0-9.]*\).*/\1/p' <<<"$line")
      [[ -n "${rps[$mode.$r]}" && -n "${cpu[$mode.$r]}" ]] ||
        { echo "no throughput line in demo log" >&2; cat "$work/demo-0.log" >&2; exit 1; }
    done
    printf '%-7s %12s %12s %12s %14s %14s %14s\n' "$r" "${rps[none.$r]}" "${rps[agent.$r]}" \
      "${rps[perf.$r]}" "${cpu[none.$r]}" "${cpu[agent.$r]}" "${cpu[perf.$r]}"
  done
  local median='{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
  for mode in none agent perf; do
    for ((r = 1; r <= ROUNDS; r++)); do echo "${rps[$mode.$r]}"; done | sort -g | awk "$median" \
      >"$work/median-$mode"
    for ((r = 1; r <= ROUNDS; r++)); do echo "${cpu[$mode.$r]}"; done | sort -g | awk "$median" \
      >"$work/median-cpu-$mode"
  done
  awk -v n="$(cat "$work/median-none")" -v a="$(cat "$work/median-agent")" \
      -v p="$(cat "$work/median-perf")" -v cn="$(cat "$work/median-cpu-none")" \
      -v ca="$(cat "$work/median-cpu-agent")" -v cp="$(cat "$work/median-cpu-perf")" -v hz="$hz" 'BEGIN {
    printf "%-7s %12.3f %12.3f %12.3f %14.4f %14.4f %14.4f\n", "median", n, a, p, cn, ca, cp
    printf "slowdown vs alone (requests/s): agent %.2f %%, perf record %.2f %%\n",
      100 * (n - a) / n, 100 * (n - p) / n
    printf "slowdown vs alone (target CPU per request): agent %.2f %%, perf record %.2f %%\n",
      100 * (ca - cn) / cn, 100 * (cp - cn) / cn
    if (hz != 99) {
      printf "scaled to 99 Hz (x 99/%d): requests/s agent %.3f %%, perf record %.3f %%; CPU per", hz,
        100 * (n - a) / n * 99 / hz, 100 * (n - p) / n * 99 / hz
      printf " request agent %.3f %%, perf record %.3f %%\n", 100 * (ca - cn) / cn * 99 / hz,
        100 * (cp - cn) / cn * 99 / hz
    } }'
}

# One row of a table of case f/g: the tool's result under LABEL.
row() {
  awk -v label="$1" -v tool="$2" -v r="$3" 'BEGIN {
    split(r, a, " ")
    printf "%-30s %-22s %9.3f %9.1f %9.1f %6d %9d %9.1f %6d\n", label, tool, a[1], a[2], a[3],
      a[4], a[5], a[6], a[7] }'
}

# Case f: the agent in three configurations and perf record with kernel samples.
run_beyond_cpu() {
  local saved=$AGENT_ARGS config name i=0 base=
  echo
  echo "f: demo 2 thr, 99 Hz: kernel stacks and off-CPU (agent vs perf record -e cpu-clock, user"
  echo "   and kernel, --call-graph dwarf); cpu_% ratio to the agent without kernel stacks"
  start_demos 1 --threads 2
  for config in "--kernel-stacks off" "--kernel-stacks on" "--kernel-stacks on --off-cpu"; do
    name=f$((i++))
    AGENT_ARGS="$saved $config"
    measure_tool agent 99 "$name"
    [[ -n $base ]] || base=$result
    row "" "agent $config" "$result"
    awk -v r="$result" -v b="$base" 'BEGIN { split(r, a, " "); split(b, z, " ")
      if (z[1] > 0) printf "%-30s %-22s %8.2fx\n", "", "  vs kernel-stacks off", a[1] / z[1] }'
    sed -n 's/.*\] \(kernel stacks: .*\)/  agent \1/p; s/.*\] \(off-CPU: .*\)/  agent \1/p' \
      "$work/agent-$name.log" | tail -2
  done
  AGENT_ARGS=$saved
  PERF_EVENT=cpu-clock
  measure_tool perf 99 f3
  PERF_EVENT=cpu-clock:u
  row "" "perf -e cpu-clock" "$result"
  stop TERM "${targets[@]}"
}

# Case g: off-CPU of a lock-heavy process.
run_lock_heavy() {
  local saved=$AGENT_ARGS p log
  echo
  echo "g: blocking_service --mode lock-heavy --threads $LOCK_THREADS --burn-ms 0.2 (threads"
  echo "   waiting on one mutex), 99 Hz"
  "$BLOCKING" --mode lock-heavy --threads "$LOCK_THREADS" --burn-ms 0.2 >"$work/blocking.log" 2>&1 &
  p=$!
  pids+=("$p")
  targets=("$p")
  AGENT_ARGS="$saved --kernel-stacks on"
  measure_tool agent 99 g0
  row "" "agent (cpu only)" "$result"
  AGENT_ARGS="$saved --kernel-stacks on --off-cpu"
  measure_tool agent 99 g1
  row "" "agent --off-cpu" "$result"
  AGENT_ARGS=$saved
  PERF_EVENT=context-switches
  PERF_EXTRA=(-c 1)
  measure_tool perf 99 g2
  PERF_EVENT=cpu-clock:u
  PERF_EXTRA=()
  row "" "perf -e cs -c 1" "$result"
  log=$work/agent-g1.log
  awk -v secs="$(awk -v w="$WARMUP" -v s="$seconds" 'BEGIN {print w + s}')" '
    /off-CPU: / { for (i = 1; i <= NF; i++) { if ($(i + 1) == "switch-outs,") outs = $i
                                             if ($(i + 1) == "counted") counted = $i } }
    /batches: / { for (i = 1; i <= NF; i++) { if ($(i + 1) == "cpu") cb = $i
                                             if ($(i + 1) == "off-cpu") ob = $i }
                  gsub(/[()]/, ""); n = 0
                  for (i = 1; i <= NF; i++) if ($(i + 1) == "bytes,") cbytes = $i
                  obytes = $(NF - 1) }
    END { printf "  agent --off-cpu: %.0f switch-outs/s, %.0f intervals counted/s (over ~%d s); " \
                 "bytes per batch: cpu %.0f, off-cpu %.0f\n", outs / secs, counted / secs, secs,
                 (cb > 0 ? cbytes / cb : 0), (ob > 0 ? obytes / ob : 0) }' "$log"
  stop TERM "$p"
}

hdr_printed=0
header() {
  ((hdr_printed)) && return 0
  hdr_printed=1
  echo "agent: strata-agent (cpu-clock, user mode, its default 16 KiB stack copy unless AGENT_ARGS"
  echo "  sets --stack-bytes; --interval $INTERVAL${AGENT_ARGS:+; $AGENT_ARGS}) vs perf record -e cpu-clock:u"
  echo "  --call-graph dwarf,$PERF_STACK (${PERF_STACK}-byte stack dump) -o <temp file>, same -F"
  echo "window: $seconds s per tool per case, after a $WARMUP s warm-up from attach; $(nproc) CPUs," \
    "load average $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "cpu_%: % of one core, all threads (schedstat); MiB: VmRSS / VmHWM at the window's end;"
  echo "samples: the tool's own count over its run; /s: per second attached"
  printf '%-30s %-10s %9s %9s %9s %6s %9s %9s %6s\n' case tool cpu_% rss_MiB hwm_MiB fds samples \
    samples/s lost
}

for c in $CASES; do
  case $c in
    a)
      header
      start_demos 1 --threads 2
      run_case a "a: demo 2 thr, 99 Hz" 99
      stop TERM "${targets[@]}" ;;
    b)
      header
      start_demos 1 --threads 2 --idle-threads "$IDLE"
      run_case b "b: 2 busy + $IDLE idle, 99 Hz" 99
      stop TERM "${targets[@]}" ;;
    c)
      header
      start_demos "$PROCS" --threads 2
      run_case c "c: $PROCS demo procs, 99 Hz" 99
      stop TERM "${targets[@]}" ;;
    d)
      header
      start_demos 1 --threads 2
      run_case d "d: demo 2 thr, 999 Hz" 999
      stop TERM "${targets[@]}" ;;
    e) for hz in $SLOWDOWN_HZ; do run_slowdown "$hz"; done ;;
    f) header; run_beyond_cpu ;;
    g) header; run_lock_heavy ;;
    *) echo "unknown case '$c' (a b c d e f g)" >&2; exit 2 ;;
  esac
done

if [[ -n "${res[a_agent]:-}" && -n "${res[b_agent]:-}" ]]; then
  echo
  echo "a vs b: 2 -> $((IDLE + 2)) target threads (goal: agent within 1.2x)"
  for t in agent perf; do
    awk -v t="$t" -v ra="${res[a_$t]}" -v rb="${res[b_$t]}" 'BEGIN {
      split(ra, a, " "); split(rb, b, " ")
      printf "  %-5s fds %d -> %d (%.2fx), cpu %.3f -> %.3f %% (%.2fx), rss %.1f -> %.1f MiB (%.2fx)\n",
        t, a[4], b[4], q(b[4], a[4]), a[1], b[1], q(b[1], a[1]), a[2], b[2], q(b[2], a[2]) }
    function q(x, y) { return y > 0 ? x / y : 0 }'
  done
fi
