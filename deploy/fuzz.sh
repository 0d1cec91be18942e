#!/usr/bin/env bash
# deploy/fuzz.sh [TARGET|all] [SECONDS]: coverage-guided fuzzing of the decoders (fuzz/).
# Builds the fuzz targets in build-fuzz (clang 14, ASan+UBSan, libFuzzer) and runs one
# target, or each in turn, for SECONDS (default 600) on a working corpus
# build-fuzz/fuzz-work/<target> seeded from fuzz/corpus/<target> (new inputs stay there
# for the next run). Prints per target libFuzzer's executions and exec/s; fails if any target
# found a crash, leak, UBSan report, timeout or OOM (the input is kept, its path printed; to
# keep it as a regression seed, copy it into fuzz/corpus/<target>/).
# Environment: JOBS (build), BUILD_DIR (default build-fuzz: optimized, unlike
# deploy/sanitize.sh's -O0 build-sanitize), FUZZ_RSS_LIMIT_MB (2048),
# FUZZ_TIMEOUT (seconds per input before it counts as a hang, default 25).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
target=${1:-all}
seconds=${2:-600}
build=${BUILD_DIR:-build-fuzz}
jobs=${JOBS:-$(nproc)}

deploy/install-deps.sh

all=$(cd fuzz/corpus && ls -d */ | tr -d /)
if [[ "$target" == all ]]; then
  targets=$all
elif [[ -d "fuzz/corpus/$target" ]]; then
  targets=$target
else
  echo "fuzz.sh: unknown target '$target' (one of: $(echo $all))" >&2
  exit 2
fi

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang-14 \
  -DCMAKE_CXX_COMPILER=clang++-14 -DSTRATA_SANITIZE=address,undefined -DSTRATA_FUZZ=ON \
  -DSTRATA_BUILD_TESTS=ON -DSTRATA_BUILD_BENCHMARKS=OFF -DSTRATA_DEBUG_INFO=lines >/dev/null
cmake --build "$build" -j "$jobs" --target $(for t in $targets; do echo "${t}_fuzzer"; done)

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
summary=()
for t in $targets; do
  work="$root/$build/fuzz-work/$t"
  artifacts="$root/$build/fuzz-work/$t-crashes"
  mkdir -p "$work" "$artifacts"
  cp -n "fuzz/corpus/$t"/* "$work"/ 2>/dev/null || true
  log="$root/$build/fuzz-work/$t.log"
  echo "== $t: ${seconds}s, corpus $work ($(ls "$work" | wc -l) inputs)"
  rc=0
  "$root/$build/fuzz/${t}_fuzzer" "$work" -max_total_time="$seconds" \
    -rss_limit_mb="${FUZZ_RSS_LIMIT_MB:-2048}" -timeout="${FUZZ_TIMEOUT:-25}" \
    -print_final_stats=1 -artifact_prefix="$artifacts/" >"$log" 2>&1 || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  secs=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  line=$(printf '%-18s %12s execs %8s exec/s  cov %s  corpus %s' "$t" "${runs:-?}" "${secs:-?}" \
    "${cov:-?}" "$(ls "$work" | wc -l)")
  if [[ $rc -ne 0 ]]; then
    status=1
    line="$line  FAILED (exit $rc): $(ls -d "$artifacts"/* 2>/dev/null | tr '\n' ' ') log $log"
    grep -m1 -E 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error|fuzz check failed' \
      "$log" || true
  fi
  echo "$line"
  summary+=("$line")
done
echo "== summary"
printf '%s\n' "${summary[@]}"
exit $status
