#!/usr/bin/env bash
# build.sh <mips64el|mips64> <builddir> [extra cmake args...]: configures and builds the
# MIPS64 cross build with one CMake invocation (plus the one-time, idempotent preparation of
# its inputs: the mips64el sysroot, and GoogleTest cross-built for big-endian mips64).
#
#   mips64el: static strata-agent, unwinding libraries and tests (run under qemu-mips64el).
#   mips64:   unwinding libraries and tests only (STRATA_WITH_GRPC=OFF, qemu-mips64).
#
# Environment: JOBS (default 2), TARGETS (default: everything), STRATA_MIPS64EL_SYSROOT
# (default <builddir>/sysroot for mips64el; the big-endian build reuses a mips64el sysroot for
# Abseil's CMake package and defaults to ../build-mips64el/sysroot beside <builddir>).
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 <mips64el|mips64> <builddir> [cmake args...]" >&2
  exit 2
fi
target=$1; shift
mkdir -p "$1"; build=$(cd "$1" && pwd); shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(cd "$here/../.." && pwd)
jobs=${JOBS:-2}

common=(-G Ninja -S "$src" -B "$build" -DSTRATA_BUILD_SERVER=OFF -DSTRATA_BUILD_CLI=OFF
        -DSTRATA_BUILD_BENCHMARKS=OFF)
case "$target" in
  mips64el)
    sysroot=${STRATA_MIPS64EL_SYSROOT:-$build/sysroot}
    "$here/make-sysroot.sh" "$sysroot"
    cmake "${common[@]}" -DCMAKE_TOOLCHAIN_FILE="$here/mips64el.toolchain.cmake" \
      -DSTRATA_MIPS64EL_SYSROOT="$sysroot" -DSTRATA_STATIC_AGENT=ON "$@"
    ;;
  mips64)
    sysroot=${STRATA_MIPS64EL_SYSROOT:-$(dirname "$build")/build-mips64el/sysroot}
    "$here/make-sysroot.sh" "$sysroot"
    deps=$build/deps
    if [[ ! -f "$deps/lib/cmake/GTest/GTestConfig.cmake" ]]; then
      # GoogleTest from Debian's libgtest-dev sources, cross-compiled once.
      cmake -G Ninja -S /usr/src/googletest -B "$build/googletest-build" \
        -DCMAKE_C_COMPILER=mips64-linux-gnuabi64-gcc -DCMAKE_CXX_COMPILER=mips64-linux-gnuabi64-g++ \
        -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=mips64 -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_INSTALL_PREFIX="$deps" -DCMAKE_INSTALL_LIBDIR=lib -Dgtest_disable_pthreads=OFF >/dev/null
      cmake --build "$build/googletest-build" -j "$jobs" >/dev/null
      cmake --install "$build/googletest-build" >/dev/null
    fi
    cmake "${common[@]}" -DCMAKE_TOOLCHAIN_FILE="$here/mips64.toolchain.cmake" \
      -DSTRATA_MIPS64_DEPS="$deps" -DSTRATA_MIPS64EL_SYSROOT="$sysroot" -DSTRATA_WITH_GRPC=OFF "$@"
    ;;
  *)
    echo "unknown target '$target' (mips64el or mips64)" >&2
    exit 2
    ;;
esac
if [[ -n "${TARGETS:-}" ]]; then
  # shellcheck disable=SC2086
  ninja -C "$build" -j "$jobs" $TARGETS
else
  ninja -C "$build" -j "$jobs"
fi
