#!/usr/bin/env bash
# Planted slowdowns of one function, found (or not) by `strata compare` on real processes.
#
# For each planted size (default +2, +5 and +10 % of checksum_block's work), HOSTS processes of
# compare_workload run as version=1 and HOSTS as version=2 (the same build with --slower), each
# profiled by its own strata-agent at HZ (its own host), all at once for SECONDS; then
# `strata compare --baseline version=1 --candidate version=2` on the real server. Printed per
# size: samples per host, checksum_block's self share in each version, the change with its 95 %
# interval, the change planted (from the measured baseline share: a function of share s doing
# (1 + f) times its work has the share s (1 + f) / (1 + s f)), whether the interval holds it,
# q, and whether the comparison calls it significant (at FDR 0.05) with the right sign. Exits 1
# when an interval misses the planted change or a change of MUST_FIND percent or more (default
# 10) is not found.
#
#   tests/bench/compare/planted.sh [SECONDS=60]
#   env: BUILD (default <repo>/build; binaries in BUILD/bin), HOSTS (per version, default 4),
#        HZ (default 2999), SIZES (percent, default "2 5 10"), KEEP=1 (keep the temp dir)
#
# Single runs on whatever machine this is: the processes share its cores, so samples per host
# depend on them.
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
seconds=${1:-60}
BUILD=${BUILD:-$root/build}
HOSTS=${HOSTS:-4}
HZ=${HZ:-2999}
SIZES=${SIZES:-2 5 10}
MUST_FIND=${MUST_FIND:-10}
bin=$BUILD/bin
for b in strata-server strata-agent strata compare_workload; do
  [[ -x "$bin/$b" ]] || { echo "planted.sh: missing $bin/$b (set BUILD)" >&2; exit 2; }
done

work=$(mktemp -d /tmp/strata-planted-XXXXXX)
pids=()
cleanup() {
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -KILL "${pids[$i]}" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [[ "${KEEP:-0}" == 1 ]]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

port=$((20000 + RANDOM % 20000))
"$bin/strata-server" --listen "127.0.0.1:$port" --data "$work/data" --regressions=false \
  >"$work/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q "ready on port" "$work/server.log" && break; sleep 0.1; done
grep -q "ready on port" "$work/server.log" || { cat "$work/server.log" >&2; exit 1; }
server=127.0.0.1:$port

status=0
printf '%-6s %5s %9s %8s %8s %28s %8s %6s %8s %s\n' PLANTED HOSTS SAMPLES/H BASE% CAND% \
  "CHANGE [95 %]" EXPECTED INSIDE Q SIGNIFICANT
for size in $SIZES; do
  service=planted$size
  slower=$(awk -v p="$size" 'BEGIN {printf "%.4f", p / 100}')
  run=()
  for version in 1 2; do
    for ((h = 0; h < HOSTS; h++)); do
      args=(--seconds "$((seconds + 15))")
      [[ $version == 2 ]] && args+=(--slower "$slower")
      STRATA_SERVICE=$service STRATA_LABELS=version=$version \
        "$bin/compare_workload" "${args[@]}" >"$work/$service-v$version-$h.log" 2>&1 &
      pids+=($!)
      run+=("$!:$service-v$version-$h")
    done
  done
  agents=()
  for entry in "${run[@]}"; do
    pid=${entry%%:*} host=${entry#*:}
    # One event per thread of its own process: with per-CPU events every agent on this one
    # machine would read every process's samples and drop all but its own (N agents, N
    # times the samples each; their rings overflowed and lost most of their own).
    "$bin/strata-agent" --server "$server" --pid "$pid" --host "$host" --frequency "$HZ" \
      --sampling per-thread --interval 1 --spool-dir none >"$work/$host-agent.log" 2>&1 &
    pids+=($!)
    agents+=($!)
  done
  sleep "$seconds"
  kill -TERM "${agents[@]}" 2>/dev/null || true
  for a in "${agents[@]}"; do wait "$a" 2>/dev/null || true; done
  for entry in "${run[@]}"; do kill -TERM "${entry%%:*}" 2>/dev/null || true; done
  for entry in "${run[@]}"; do wait "${entry%%:*}" 2>/dev/null || true; done
  "$bin/strata" --server "$server" --json compare -s "$service" --baseline version=1 \
    --candidate version=2 --since 1h -n 50 >"$work/$service.json"
  python3 - "$work/$service.json" "$size" "$HOSTS" "$MUST_FIND" <<'EOF' || status=1
import json, sys
r = json.load(open(sys.argv[1]))
f = float(sys.argv[2]) / 100
hosts = int(sys.argv[3])
row = next((x for x in r.get("functions", [])
            if x["function"]["function"] == "checksum_block"), None)
if row is None:
    print(f"+{sys.argv[2]:<5} checksum_block not in the comparison"); sys.exit(1)
e = row["self"]
b = e.get("share_baseline", 0) / 100
expected = 100 * (b * (1 + f) / (1 + b * f) - b)
lo, hi = e.get("ci_low", float("nan")), e.get("ci_high", float("nan"))
samples = (int(r.get("baseline_samples", 0)) + int(r.get("candidate_samples", 0))) / (2 * hosts)
significant = e.get("significant", False) and e.get("delta", 0) > 0
print(f"+{sys.argv[2]:<5} {hosts:>5} {samples:>9.0f} {100 * b:>8.2f} "
      f"{e.get('share_candidate', 0):>8.2f} "
      f"{e.get('delta', 0):>+9.2f} pt [{lo:+.2f}, {hi:+.2f}] {expected:>+8.2f} "
      f"{'yes' if lo <= expected <= hi else 'no':>6} {e.get('q', 1):>8.2g} "
      f"{'yes' if significant else 'no'}")
sys.exit(0 if lo <= expected <= hi and (significant or f * 100 < float(sys.argv[4])) else 1)
EOF
done
exit $status
