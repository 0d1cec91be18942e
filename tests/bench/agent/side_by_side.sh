#!/usr/bin/env bash
# Two agent builds on the same demo at the same time: the CPU each takes, per thread.
#
# overhead.sh runs one tool after the other, so a VM whose speed drifts by 10-20 % between
# runs hides changes of that size. Here both agents sample the same demo_service (99 Hz,
# two busy threads) in the same window, shipping to one server, so drift and neighbours load
# them alike; the order they start in alternates between runs. Per run and agent: on-CPU
# µs/s of its main loop (the thread that reads and unwinds samples and builds batches), its
# shipper, and all its threads (schedstat); then the medians and B/A.
#
#   tests/bench/agent/side_by_side.sh AGENT_A AGENT_B [SECONDS=40]
#   env: BUILD (default <repo>/build; server and demo from BUILD/bin), INTERVAL (agent
#        --interval, default 10), RUNS (default 4), WARMUP (default 6 s), ARGS_A and ARGS_B
#        (more flags for that agent, split at spaces: one binary against itself with a flag
#        changed, e.g. AGENT_B the same build and ARGS_B="--stack-bytes 4096"), FLOOR=1 (also
#        BUILD/bin/grpc_floor in each window, one message an interval: gRPC's own cost of a
#        message to its sending thread, printed as the "floor" row's shipper µs/s)
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
[[ $# -ge 2 ]] || { sed -n '2,17p' "$0" >&2; exit 2; }
BUILD=${BUILD:-$root/build}
INTERVAL=${INTERVAL:-10}
RUNS=${RUNS:-4}
WARMUP=${WARMUP:-6}
FLOOR=${FLOOR:-0}
seconds=${3:-40}
read -r -a args_A <<<"${ARGS_A:-}"
read -r -a args_B <<<"${ARGS_B:-}"

work=$(mktemp -d /tmp/strata-side-by-side-XXXXXX)
pids=()
cleanup() {
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
# Copies, so a rebuild during the run changes neither.
cp "$1" "$work/agent-A"
cp "$2" "$work/agent-B"
cp "$BUILD/bin/strata-server" "$BUILD/bin/demo_service" "$work/"
if [[ $FLOOR == 1 ]]; then cp "$BUILD/bin/grpc_floor" "$work/"; fi

# snapshot PID: one line per thread: tid, name, on-CPU ns (schedstat).
snapshot() {
  local t
  for t in /proc/"$1"/task/*; do
    echo "${t##*/} $(tr ' ' _ <"$t/comm" 2>/dev/null)" \
      "$(awk '{print $1}' "$t/schedstat" 2>/dev/null)"
  done | awk 'NF == 3'
}
# usage BEFORE AFTER PID SECONDS: µs/s of the main loop, the shipper and all threads; a thread
# born in the window counts from 0, one that ended in it is not counted.
usage() {
  awk -v pid="$3" -v s="$4" '
    NR == FNR { before[$1] = $3; next }
    { d = $3 - before[$1]; total += d; if ($1 == pid) main += d; if ($2 ~ /shipper/) ship += d }
    END { printf "%.0f %.0f %.0f", main / s / 1000, ship / s / 1000, total / s / 1000 }' "$1" "$2"
}
wait_log() {  # wait_log FILE TEXT: up to 60 s
  local i
  for ((i = 0; i < 600; i++)); do grep -q -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "side_by_side.sh: no '$2' in $1:" >&2
  tail -5 "$1" >&2
  exit 1
}

"$work/strata-server" --listen 127.0.0.1:0 --http "" --data "$work/data" --log-level warn \
  >"$work/server.log" 2>&1 &
pids+=($!)
wait_log "$work/server.log" "ready on port"
port=$(sed -n 's/.*ready on port \([0-9]*\).*/\1/p' "$work/server.log" | head -1)

printf '%-4s %-6s %10s %10s %10s\n' run agent "main" shipper total
for ((run = 1; run <= RUNS; run++)); do
  "$work/demo_service" --threads 2 >"$work/demo.log" 2>&1 &
  demo=$!
  pids+=("$demo")
  wait_log "$work/demo.log" "ready"
  order=(A B)
  ((run % 2 == 1)) || order=(B A)
  declare -A agent=()
  for which in "${order[@]}"; do
    if [[ $which == A ]]; then extra=("${args_A[@]}"); else extra=("${args_B[@]}"); fi
    "$work/agent-$which" --server "127.0.0.1:$port" --pid "$demo" --frequency 99 \
      --interval "$INTERVAL" --spool-dir "$work/spool-$which-$run" --log-level info \
      "${extra[@]}" >"$work/agent-$which.log" 2>&1 &
    agent[$which]=$!
    pids+=($!)
  done
  for which in A B; do wait_log "$work/agent-$which.log" "profiling pid"; done
  if [[ $FLOOR == 1 ]]; then
    "$work/grpc_floor" --period-ms $((INTERVAL * 1000)) --warmup-s "$WARMUP" \
      --seconds "$seconds" >"$work/floor.log" 2>&1 &
    floor=$!
    pids+=("$floor")
  fi
  sleep "$WARMUP"
  for which in A B; do snapshot "${agent[$which]}" >"$work/before-$which"; done
  sleep "$seconds"
  for which in A B; do snapshot "${agent[$which]}" >"$work/after-$which"; done
  for which in A B; do
    read -r main ship total <<<"$(usage "$work/before-$which" "$work/after-$which" \
      "${agent[$which]}" "$seconds")"
    printf '%-4s %-6s %10s %10s %10s\n' "$run" "$which" "$main" "$ship" "$total" |
      tee -a "$work/rows"
  done
  if [[ $FLOOR == 1 ]]; then
    wait "$floor" || { cat "$work/floor.log" >&2; exit 1; }
    # Its thread's µs a message, at one message a period.
    ship=$(sed -n 's/.*: \([0-9]*\) µs of the sending.*/\1/p' "$work/floor.log")
    printf '%-4s %-6s %10s %10s %10s\n' "$run" floor - \
      "$(awk -v u="$ship" -v i="$INTERVAL" 'BEGIN { printf "%.0f", u / i }')" - |
      tee -a "$work/rows"
  fi
  kill "${agent[A]}" "${agent[B]}" "$demo"
  wait "${agent[A]}" "${agent[B]}" "$demo" 2>/dev/null || true
done
echo "(µs of CPU per second; $RUNS runs of ${seconds} s, --interval $INTERVAL," \
  "the order alternating${ARGS_A:+; A with $ARGS_A}${ARGS_B:+; B with $ARGS_B})"
awk '
  { v[$2, "main", ++n[$2]] = $3; v[$2, "shipper", n[$2]] = $4; v[$2, "total", n[$2]] = $5 }
  function median(a, k,    i, j, t, x) {
    for (i = 1; i <= n[a]; i++) x[i] = v[a, k, i]
    for (i = 2; i <= n[a]; i++) for (j = i; j > 1 && x[j - 1] > x[j]; j--) {
      t = x[j]; x[j] = x[j - 1]; x[j - 1] = t
    }
    return n[a] % 2 ? x[(n[a] + 1) / 2] : (x[n[a] / 2] + x[n[a] / 2 + 1]) / 2
  }
  function ratio(k) {
    return median("A", k) > 0 ? sprintf("%.2fx", median("B", k) / median("A", k)) : "-"
  }
  END {
    printf "%-11s %10s %10s %10s\n", "median", "main", "shipper", "total"
    for (a = 0; a < 2; a++) {
      w = a ? "B" : "A"
      printf "%-11s %10.0f %10.0f %10.0f\n", w, median(w, "main"), median(w, "shipper"),
             median(w, "total")
    }
    printf "%-11s %10s %10s %10s\n", "B/A", ratio("main"), ratio("shipper"), ratio("total")
    if (n["floor"] > 0) {
      printf "%-11s %10s %10.0f %10s\n", "floor", "-", median("floor", "shipper"), "-"
      printf "%-11s %10s %10.2fx %9s\n", "A/floor", "-",
             median("A", "shipper") / median("floor", "shipper"), "-"
    }
  }' "$work/rows"
