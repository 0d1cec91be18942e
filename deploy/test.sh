#!/usr/bin/env bash
# deploy/test.sh: installs dependencies, builds Strata and runs every test through CTest:
# the x86-64 build (unit, integration, end-to-end on loopback with real perf events) and the
# MIPS64 cross builds (mips64el and big-endian mips64, run under qemu user mode), then the
# ASan+UBSan build with the libFuzzer targets (deploy/sanitize.sh asan).
# Benchmarks are not part of this run: see deploy/bench.sh.
#
# Environment: BUILD_DIR (default build), JOBS (default: number of cores),
# STRATA_SKIP_MIPS64=1 skips the MIPS64 part, STRATA_SKIP_SANITIZE=1 the sanitizer and fuzz part.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
build=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}

# Each part's wall time, printed at the end: where the run's time goes.
parts=()
status=0
part_started=$SECONDS
part_done() {
  parts+=("$(printf '%-46s %4d min %02d s' "$1" $(((SECONDS - part_started) / 60)) \
    $(((SECONDS - part_started) % 60)))")
  part_started=$SECONDS
}
# The failed tests of every part, and the end of each one's output, repeated at the end: CI
# keeps only the tail of the output.
failures=()
failed_outputs=()  # "LOG<TAB>TEST NAME" of each failed test
record_failures() {  # record_failures PART BUILD_DIR: the failed tests of its last ctest.
  local part=$1 dir=$2 failed="$2/Testing/Temporary/LastTestsFailed.log" line
  # A later ctest in the same directory (the mips64el Python reader runs in the x86-64 build)
  # overwrites LastTest.log: each failed part keeps its own copy.
  local log="$dir/Testing/Temporary/LastTest.failed-${#failures[@]}.log"
  cp "$dir/Testing/Temporary/LastTest.log" "$log" 2>/dev/null || true
  status=1
  if [[ -s $failed ]]; then
    while IFS= read -r line; do
      failures+=("$part: ${line#*:}")
      failed_outputs+=("$log"$'\t'"${line#*:}")
    done <"$failed"
  else
    failures+=("$part: failed before or outside its tests (see above)")
  fi
}
run_ctest() {  # run_ctest PART BUILD_DIR CTEST_ARGS...: ctest in BUILD_DIR; records failures.
  local part=$1 dir=$2
  shift 2
  rm -f "$dir/Testing/Temporary/LastTestsFailed.log"
  (cd "$dir" && ctest --output-on-failure "$@") || record_failures "$part" "$dir"
}
print_parts() {
  echo "== time per part"
  printf '  %s\n' "${parts[@]}"
  printf '  %-46s %4d min %02d s\n' "total" $((SECONDS / 60)) $((SECONDS % 60))
  if ((${#failures[@]})); then
    echo "== failed"
    printf '  %s\n' "${failures[@]}"
    local entry log name output
    for entry in "${failed_outputs[@]}"; do
      log=${entry%%$'\t'*} name=${entry#*$'\t'}
      echo "== the end of $name's output ($log)"
      output=$(awk -v name="$name" '$0 ~ "Testing: " && $NF == name {found = 1; next}
        found && /^<end of output>/ {exit} found' "$log")
      # GoogleTest's failure lines first (a failure may print a long log after them).
      grep -A 6 -m 8 ': Failure$' <<<"$output" | head -n 60 || true
      echo "-- its last lines"
      tail -n 30 <<<"$output"
    done
  fi
}
trap print_parts EXIT

"$root/deploy/install-deps.sh"
part_done "dependencies"

# One Go build cache for every build below: the Go test programs are the same in each, so the
# cross and sanitizer builds reuse what the x86-64 build compiled.
export STRATA_GO_CACHE="$root/$build/go/cache"

echo "== x86-64 build ($build)"
# Line tables only for Strata's own code (STRATA_DEBUG_INFO: backtraces keep file:line; workloads
# whose DWARF the tests read keep full debug information), and the tests' own sources at -O1
# (STRATA_TEST_OPT_LEVEL; the libraries under test keep -O2): at -O2 they were half of the
# build's compile time, at -O1 they take 0.59x as long.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_BUILD_TESTS=ON \
  -DSTRATA_BUILD_BENCHMARKS=OFF -DSTRATA_DEBUG_INFO=lines -DSTRATA_TEST_OPT_LEVEL=1 >/dev/null
cmake --build "$build" -j "$jobs"
# Debian unstable's python3.14 and python3.15 (bookworm has 3.11), unpacked into the build with
# their own C library: tests/e2e/python profiles them (a few seconds; Debian's archive only).
# The sanitizer build's tests read the same interpreters.
if deploy/cross/make-python-next-root.sh "$build/python-next"; then
  mkdir -p build-sanitize && ln -sfn "$root/$build/python-next" build-sanitize/python-next
else
  failures+=("python 3.14/3.15 root: deploy/cross/make-python-next-root.sh failed")
  status=1
fi
# Debian's OpenJDK 21 and 25 (bookworm has 17), likewise: tests/e2e/jvm profiles them too.
if ! deploy/cross/make-jdk-root.sh "$build/jdk"; then
  failures+=("OpenJDK 21/25 root: deploy/cross/make-jdk-root.sh failed")
  status=1
fi
part_done "x86-64 build"

# The cross and sanitizer builds run beside the x86-64 tests at the lowest CPU priority: those
# tests spend much of their time waiting (on servers, agents, the clock), and a build at nice 19
# gets only what they leave (a CFS weight of 15 against their 1,024). Each build's output goes
# to its log under $logs, printed if it fails; its time and outcome to $other_builds.
logs="$root/$build/other-builds"
other_builds="$logs/outcomes"
rm -rf "$logs" && mkdir -p "$logs" && : >"$other_builds"
build_beside() {  # build_beside NAME COMMAND...: runs COMMAND niced, logs it, records the outcome.
  local name=$1 started=$SECONDS outcome=ok
  shift
  nice -n 19 "$@" >"$logs/$name.log" 2>&1 || outcome=failed
  echo "$name $outcome $((SECONDS - started))" >>"$other_builds"
}
other_builds_run() {
  if [[ "${STRATA_SKIP_MIPS64:-0}" != 1 ]]; then
    build_beside mips64el env JOBS="$jobs" deploy/cross/build.sh mips64el build-mips64el \
      -DSTRATA_DEBUG_INFO=lines -DSTRATA_TEST_OPT_LEVEL=1
    # Debian's mips64el python3.11, unpacked beside its sysroot: the Python frame reader's
    # tests read a live interpreter under qemu, from x86-64 and as MIPS64 code.
    build_beside mips64el-python deploy/cross/make-python-root.sh build-mips64el/python-root \
      build-mips64el/sysroot
    build_beside mips64 env JOBS="$jobs" deploy/cross/build.sh mips64 build-mips64 \
      -DSTRATA_DEBUG_INFO=lines -DSTRATA_TEST_OPT_LEVEL=1
  fi
  if [[ "${STRATA_SKIP_SANITIZE:-0}" != 1 ]]; then
    build_beside sanitize env JOBS="$jobs" deploy/sanitize.sh asan build
  fi
}
other_builds_run &
other_builds_pid=$!
built() {  # built NAME: whether the build NAME beside the tests succeeded; records it if not.
  if grep -q "^$1 ok " "$other_builds"; then
    return 0
  fi
  echo "== $1 build failed; the end of $logs/$1.log:"
  tail -n 40 "$logs/$1.log" || true
  failures+=("$1 build: failed (log: $logs/$1.log)")
  status=1
  return 1
}

echo "== x86-64 tests (the other builds beside them, at nice 19)"
# No reruns: a test that fails now and then is a bug, in the code or in the test.
run_ctest "x86-64" "$build" -j "$jobs" --timeout 900
part_done "x86-64 tests"
wait "$other_builds_pid" || true
part_done "the other builds' rest, after the x86-64 tests"
while read -r name outcome seconds; do
  parts+=("$(printf '%-46s %4d min %02d s (%s)' "  $name build beside them" $((seconds / 60)) \
    $((seconds % 60)) "$outcome")")
done <"$other_builds"

if [[ "${STRATA_SKIP_MIPS64:-0}" != 1 ]]; then
  # The MIPS64 end-to-end test ships to the x86-64 server and queries it with the CLI.
  export STRATA_HOST_BIN_DIR="$root/$build/bin"
  if built mips64el-python; then
    export STRATA_MIPS64EL_PYTHON_ROOT="$root/build-mips64el/python-root"
    echo "== x86-64 reader of a mips64el Python (qemu user mode)"
    run_ctest "x86-64 reader of mips64el Python" "$build" -R 'Mips64elPython' --timeout 900
    part_done "x86-64 reader of a mips64el Python"
  fi
  for arch in mips64el mips64; do
    if built "$arch"; then
      echo "== $arch tests (qemu user mode)"
      run_ctest "$arch" "build-$arch" -j "$jobs" --timeout 900
      part_done "$arch tests (qemu user mode)"
    fi
  done
fi
if [[ "${STRATA_SKIP_SANITIZE:-0}" != 1 ]] && built sanitize; then
  # Every unit and integration test under ASan+UBSan, and every libFuzzer target over its
  # seed corpus plus a short budget (long fuzzing: deploy/fuzz.sh).
  echo "== ASan+UBSan unit and integration tests, fuzz targets (build-sanitize)"
  rm -f build-sanitize/Testing/Temporary/LastTestsFailed.log
  STRATA_FUZZ_SECONDS=${STRATA_FUZZ_SECONDS:-10} JOBS=$jobs deploy/sanitize.sh asan test ||
    record_failures "ASan+UBSan" build-sanitize
  part_done "ASan+UBSan tests, fuzz targets"
fi
exit $status
