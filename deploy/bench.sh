#!/usr/bin/env bash
# deploy/bench.sh: builds the benchmarks and runs them, printing every figure with its
# comparison anchor from the same run. Not part of deploy/test.sh (it takes ~80 minutes, 35 of
# them the 30-minute server outage of `faults`, ~14 the agent's overhead against perf record's
# and its shipper's against gRPC's own cost of a message, `agent`).
#
#   deploy/bench.sh                 all of them
#   deploy/bench.sh table unwind    only those (backbone encoding table unwind mips64 query fleet tls
#                                   otlp faults agent languages fdo symbolize cluster compare)
#
# Figures are single runs on whatever machine this is: compare ratios, not absolute times.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${BUILD_DIR:-build}
"$PWD/deploy/install-deps.sh"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_BUILD_TESTS=ON \
  -DSTRATA_BUILD_BENCHMARKS=ON >/dev/null
cmake --build "$build" -j "$(nproc)"
bin=$build/bin
want=("$@")
[[ ${#want[@]} -gt 0 ]] || want=(backbone encoding table unwind mips64 query fleet tls otlp faults agent languages fdo symbolize cluster compare)
for b in "${want[@]}"; do
  echo "===== $b"
  case $b in
    backbone) tests/bench/backbone/figures.sh 60 "$bin" ;;
    encoding) "$bin/encoding_benchmark" ;;
    table) "$bin/table_benchmark" ;;
    unwind)
      "$bin/unwind_benchmark" --benchmark_min_time=0.3
      BUILD="$PWD/$build" tests/bench/unwind/agent_cpu.sh ;;
    mips64) "$bin/mips64_lookup_benchmark" ;;
    query) "$bin/query_benchmark" ;;
    fleet) tests/bench/fleet/fleet.sh "$bin" ;;
    tls) tests/bench/fleet/tls.sh "$bin" ;;
    otlp)  # OTLP exports vs Strata's stream, same samples; the conversion vs parsing
      tests/bench/fleet/otlp.sh "$bin"
      "$bin/otlp_convert_benchmark" ;;
    faults) tests/bench/faults/outage_rss.sh 30 "$bin" ;;
    agent)  # vs perf record, dwarf; then the shipper at 1 s against gRPC's own cost a message
      BUILD="$(cd "$build" && pwd)" tests/bench/agent/overhead.sh
      BUILD="$(cd "$build" && pwd)" INTERVAL=1 FLOOR=1 tests/bench/agent/side_by_side.sh \
        "$bin/strata-agent" "$bin/strata-agent" 40 ;;
    languages)  # C++ vs Python and Go targets, each agent sampling its own target's threads
      BUILD="$(cd "$build" && pwd)" AGENT_ARGS="--sampling per-thread" \
        CASES="cpp cppmix py py-read py-off go go-switches" tests/bench/agent/language_cost.sh ;;
    fdo) tests/bench/fdo/fdo.sh "$bin" ;;
    symbolize) "$bin/symbolize_benchmark" --benchmark_min_time=0.5 ;;  # per frame, vs addr2line
    cluster) tests/bench/cluster/cluster.sh "$bin" ;;  # per node count, RF 1 vs 2, fan-out queries
    compare)  # detection curve, A/A rate, cost of one comparison; planted slowdowns, real processes
      "$bin/compare_benchmark"
      BUILD="$(cd "$build" && pwd)" tests/bench/compare/planted.sh ;;
    *) echo "unknown benchmark '$b'" >&2; exit 2 ;;
  esac
done
