#!/usr/bin/env bash
# make-jdk-root.sh <root-dir>: a HotSpot release the agent reads that bookworm does not ship
# (OpenJDK 21, from Debian trixie), unpacked into <root-dir> with trixie's C library and loader,
# and <root-dir>/bin/java, which runs it through that loader. Packages come with `apt-get
# download` and `dpkg -x` through private package lists (apt-options.sh, for amd64); nothing is
# installed. tests/e2e/jvm profiles this JVM when <root-dir> is the x86-64 build's jdk21/ (its
# programs compiled by the host's javac). Idempotent.
set -euo pipefail
if [[ $# -ne 1 ]]; then
  echo "usage: $0 <root-dir>" >&2
  exit 2
fi
ROOT=$(mkdir -p "$1" && cd "$1" && pwd)
JDK=usr/lib/jvm/java-21-openjdk-amd64
[[ -x "$ROOT/bin/java" && -f "$ROOT/$JDK/lib/server/libjvm.so" ]] && {
  echo "jdk root $ROOT is ready"; exit 0; }
APTDIR="$ROOT/.apt"
APT_ARCH=amd64
# shellcheck source=apt-options.sh
source "$(dirname "${BASH_SOURCE[0]}")/apt-options.sh"
unpack_packages "$ROOT" trixie openjdk-21-jre-headless libc6 libgcc-s1 libstdc++6 zlib1g
mkdir -p "$ROOT/bin"
cat >"$ROOT/bin/java" <<WRAPPER
#!/bin/sh
# OpenJDK 21 from Debian trixie, through trixie's loader and C library (make-jdk-root.sh).
exec "$ROOT/usr/lib64/ld-linux-x86-64.so.2" --library-path \\
  "$ROOT/usr/lib/x86_64-linux-gnu:$ROOT/$JDK/lib:$ROOT/$JDK/lib/server" "$ROOT/$JDK/bin/java" "\$@"
WRAPPER
chmod +x "$ROOT/bin/java"
"$ROOT/bin/java" -version
echo "jdk root ready: $ROOT ($(du -sh "$ROOT" | cut -f1))"
