#!/usr/bin/env bash
# deploy/package.sh: the Debian packages strata-server, strata-agent and strata-cli, built by
# CPack from the one CMake build (rules and maintainer scripts: deploy/CMakeLists.txt,
# deploy/debian/). Builds first if needed; writes BUILD_DIR/packages/*.deb.
#
#   deploy/package.sh [BUILD_DIR]        (default build; configured like deploy/test.sh if new)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:-build}
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$build" --target strata-server strata-agent strata strata_inproc
(cd "$build" && cpack --config CPackConfig.cmake -B "$(pwd)/packages")
ls -l "$build"/packages/*.deb
