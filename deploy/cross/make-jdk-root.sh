#!/usr/bin/env bash
# make-jdk-root.sh <root-dir>: the HotSpot releases the agent reads that bookworm does not ship
# (OpenJDK 21 and 25, from Debian trixie and unstable), unpacked into <root-dir> with
# unstable's C library and loader, and <root-dir>/<release>/bin/java, which runs that release
# through that loader. Packages come with `apt-get download` and `dpkg -x` through private
# package lists (apt-options.sh, for amd64); nothing is installed. tests/e2e/jvm profiles these
# JVMs when <root-dir> is the x86-64 build's jdk/ (its programs compiled by the host's javac).
# Idempotent.
set -euo pipefail
if [[ $# -ne 1 ]]; then
  echo "usage: $0 <root-dir>" >&2
  exit 2
fi
RELEASES=(21 25)
ROOT=$(mkdir -p "$1" && cd "$1" && pwd)
ready=1
for r in "${RELEASES[@]}"; do
  [[ -x "$ROOT/$r/bin/java" &&
     -f "$ROOT/usr/lib/jvm/java-$r-openjdk-amd64/lib/server/libjvm.so" ]] || ready=0
done
((ready)) && { echo "jdk root $ROOT is ready"; exit 0; }
APTDIR="$ROOT/.apt"
APT_ARCH=amd64
# shellcheck source=apt-options.sh
source "$(dirname "${BASH_SOURCE[0]}")/apt-options.sh"
PKGS=(libc6 libgcc-s1 libstdc++6 zlib1g)
for r in "${RELEASES[@]}"; do PKGS+=("openjdk-$r-jre-headless"); done
unpack_packages "$ROOT" "trixie unstable" "${PKGS[@]}"
for r in "${RELEASES[@]}"; do
  jdk="$ROOT/usr/lib/jvm/java-$r-openjdk-amd64"
  mkdir -p "$ROOT/$r/bin"
  cat >"$ROOT/$r/bin/java" <<WRAPPER
#!/bin/sh
# OpenJDK $r from Debian, through unstable's loader and C library (make-jdk-root.sh).
exec "$ROOT/usr/lib64/ld-linux-x86-64.so.2" --library-path \\
  "$ROOT/usr/lib/x86_64-linux-gnu:$jdk/lib:$jdk/lib/server" "$jdk/bin/java" "\$@"
WRAPPER
  chmod +x "$ROOT/$r/bin/java"
  "$ROOT/$r/bin/java" -version 2>&1 | head -n 2
done
echo "jdk root ready: $ROOT ($(du -sh "$ROOT" | cut -f1))"
