#!/usr/bin/env bash
# deploy/sanitize.sh [asan|tsan] [build|test]: sanitizer builds and their tests (clang 14);
# `build` or `test` does only that half of asan (deploy/test.sh builds beside other tests).
#
#  asan (default): build-sanitize, AddressSanitizer + UndefinedBehaviorSanitizer (every finding
#     aborts) with the libFuzzer targets (STRATA_FUZZ=ON); runs `ctest -LE e2e`: every unit and
#     integration test under ASan+UBSan, then every fuzz target over its seed corpus plus
#     STRATA_FUZZ_SECONDS (default 10) of fuzzing. The end-to-end suites (label e2e, which
#     includes faults) are left out: they start real servers and agents on loopback with
#     timing-based expectations, and deploy/test.sh runs them on the regular build.
#     Built at -O0 with line tables only: instrumented -O2 code takes three times as long to
#     compile, and what these tests check does not depend on it (deploy/fuzz.sh, which fuzzes
#     for long, optimizes).
#  tsan: build-tsan, ThreadSanitizer; builds and runs the server's concurrent-path tests only
#     (server_test: ingest AgentSession, WindowAggregator, HTTP server, profiles;
#     capture_service_test; store_test), run directly (not through CTest) with
#     deploy/sanitizers/tsan_absl_sync.cc preloaded, which makes Debian's uninstrumented
#     Abseil Mutex/CondVar/Notification visible to TSan. No unit test covers the ingest
#     WorkerPool (it runs only in the end-to-end suites).
#
# Environment: JOBS (default: number of cores), BUILD_DIR (default build-sanitize /
# build-tsan), STRATA_FUZZ_SECONDS (asan: fuzzing per target in the fuzz tests).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mode=${1:-asan}
step=${2:-all}
if [[ ! $step =~ ^(all|build|test)$ ]]; then
  echo "usage: deploy/sanitize.sh [asan|tsan] [build|test]" >&2
  exit 2
fi
jobs=${JOBS:-$(nproc)}

deploy/install-deps.sh

# The Go 1.21+ programs are the x86-64 build's to check (STRATA_GO_VERSIONS): fetching and
# building them again here would only repeat those tests.
common=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang-14
        -DCMAKE_CXX_COMPILER=clang++-14 -DSTRATA_BUILD_TESTS=ON -DSTRATA_BUILD_BENCHMARKS=OFF
        -DSTRATA_GO_VERSIONS=)
# Reports with stacks; leaks are checked at exit (ASan) and per input (libFuzzer).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:check_initialization_order=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

case "$mode" in
  asan)
    build=${BUILD_DIR:-build-sanitize}
    # No end-to-end test binaries: this part runs none of them (ctest -LE e2e below), and
    # building them under ASan was a sixth of its build.
    if [[ $step != test ]]; then
      echo "== ASan+UBSan build with fuzz targets ($build)"
      cmake -S . -B "$build" "${common[@]}" -DSTRATA_SANITIZE=address,undefined \
        -DSTRATA_FUZZ=ON -DSTRATA_BUILD_E2E=OFF -DSTRATA_OPT_LEVEL=0 -DSTRATA_DEBUG_INFO=lines \
        -DSTRATA_FUZZ_SECONDS="${STRATA_FUZZ_SECONDS:-10}" >/dev/null
      cmake --build "$build" -j "$jobs"
    fi
    [[ $step == build ]] && exit 0
    echo "== unit, integration and fuzz tests under ASan+UBSan (ctest -LE e2e)"
    # Left out under ASan (they pass in the regular build; deploy/test.sh runs them):
    #  - inproc_accuracy_preload, inproc_accuracy_dynlib: the workload's TLS accesses from its
    #    shared library go through ASan's __tls_get_addr interceptor, so samples land in the
    #    ASan runtime between shadow-stack updates and the exact-stack check fails.
    #  - SnapshotUnwindTest.SignalHandler: its share of samples taken inside the signal handler
    #    and of samples in code mapped after the recorder's last maps read depend on timing,
    #    which the instrumented recorder changes (the unwinder under test still agrees with
    #    libdw on every sample it can compare).
    exclude='^(inproc_accuracy_preload|inproc_accuracy_dynlib|SnapshotUnwindTest\.SignalHandler)$'
    (cd "$build" && ctest -LE e2e -E "$exclude" --output-on-failure -j "$jobs" --timeout 1800)
    ;;
  tsan)
    build=${BUILD_DIR:-build-tsan}
    echo "== ThreadSanitizer build ($build)"
    cmake -S . -B "$build" "${common[@]}" -DSTRATA_SANITIZE=thread -DSTRATA_FUZZ=OFF >/dev/null
    # Not ingest_service_test: it runs a gRPC server and client in-process, and Debian's gRPC
    # and Abseil (time zones, the deadlock detector) are not instrumented, so TSan reports
    # their internal handovers. The ingest sessions and the committer are covered by server_test.
    tests=(server_test capture_service_test store_test query_service_test)
    cmake --build "$build" -j "$jobs" --target "${tests[@]}"
    # Debian's Abseil is not built with TSan: without deploy/sanitizers/tsan_absl_sync.cc
    # (preloaded) every access guarded by an absl::Mutex would be reported as a race.
    clang++-14 -std=c++20 -O1 -fPIC -shared deploy/sanitizers/tsan_absl_sync.cc \
      -o "$build/libstrata_tsan_absl_sync.so" -ldl
    # Suppressions: third-party races TSan cannot see through (each with its reason).
    export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/deploy/sanitizers/tsan.supp}
    # Left out: StoreTest.CommittedDataSurvivesProcessKill forks the multi-threaded test and
    # starts RocksDB's threads in the child, which TSan does not support (it dies there).
    declare -A filter=([store_test]=-StoreTest.CommittedDataSurvivesProcessKill)
    status=0
    for t in "${tests[@]}"; do
      echo "== $t under ThreadSanitizer"
      LD_PRELOAD="$PWD/$build/libstrata_tsan_absl_sync.so" "$build/tests/$t" --gtest_brief=1 \
        --gtest_filter="${filter[$t]:-*}" || status=1
    done
    exit $status
    ;;
  *)
    echo "usage: deploy/sanitize.sh [asan|tsan]" >&2
    exit 2
    ;;
esac
