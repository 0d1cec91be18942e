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
failed_outputs=()  # "BUILD_DIR<TAB>TEST NAME" of each failed test
record_failures() {  # record_failures PART BUILD_DIR: the failed tests of its last ctest.
  local part=$1 dir=$2 failed="$2/Testing/Temporary/LastTestsFailed.log" line
  status=1
  if [[ -s $failed ]]; then
    while IFS= read -r line; do
      failures+=("$part: ${line#*:}")
      failed_outputs+=("$dir"$'\t'"${line#*:}")
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
    local entry dir name
    for entry in "${failed_outputs[@]}"; do
      dir=${entry%%$'\t'*} name=${entry#*$'\t'}
      echo "== the end of $name's output ($dir)"
      awk -v name="$name" '$0 ~ "Testing: " && $NF == name {found = 1; next}
        found && /^<end of output>/ {exit} found' "$dir/Testing/Temporary/LastTest.log" | tail -n 30
    done
  fi
}
trap print_parts EXIT

"$root/deploy/install-deps.sh"
part_done "dependencies"

echo "== x86-64 build ($build)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_BUILD_TESTS=ON \
  -DSTRATA_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$build" -j "$jobs"
part_done "x86-64 build"

echo "== x86-64 tests"
# No reruns: a test that fails now and then is a bug, in the code or in the test.
run_ctest "x86-64" "$build" -j "$jobs" --timeout 900
part_done "x86-64 tests"

if [[ "${STRATA_SKIP_MIPS64:-0}" != 1 ]]; then
  # The MIPS64 end-to-end test ships to the x86-64 server and queries it with the CLI.
  export STRATA_HOST_BIN_DIR="$root/$build/bin"
  for arch in mips64el mips64; do
    echo "== $arch cross build (build-$arch)"
    JOBS=$jobs deploy/cross/build.sh "$arch" "build-$arch" >/dev/null
    part_done "$arch cross build"
    if [[ $arch == mips64el ]]; then
      # Debian's mips64el python3.11, unpacked beside its sysroot: the Python frame reader's
      # tests read a live interpreter under qemu, from x86-64 and as MIPS64 code.
      deploy/cross/make-python-root.sh build-mips64el/python-root build-mips64el/sysroot >/dev/null
      export STRATA_MIPS64EL_PYTHON_ROOT="$root/build-mips64el/python-root"
      echo "== x86-64 reader of a mips64el Python (qemu user mode)"
      run_ctest "x86-64 reader of mips64el Python" "$build" -R 'Mips64elPython' --timeout 900
      part_done "mips64el Python root and its reader test"
    fi
    echo "== $arch tests (qemu user mode)"
    run_ctest "$arch" "build-$arch" -j "$jobs" --timeout 900
    part_done "$arch tests (qemu user mode)"
  done
fi
if [[ "${STRATA_SKIP_SANITIZE:-0}" != 1 ]]; then
  # Every unit and integration test under ASan+UBSan, and every libFuzzer target over its
  # seed corpus plus a short budget (long fuzzing: deploy/fuzz.sh).
  echo "== ASan+UBSan build, unit and integration tests, fuzz targets (build-sanitize)"
  rm -f build-sanitize/Testing/Temporary/LastTestsFailed.log
  STRATA_FUZZ_SECONDS=${STRATA_FUZZ_SECONDS:-10} JOBS=$jobs deploy/sanitize.sh asan ||
    record_failures "ASan+UBSan" build-sanitize
  part_done "ASan+UBSan build and tests, fuzz targets"
fi
exit $status
