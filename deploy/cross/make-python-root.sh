#!/usr/bin/env bash
# make-python-root.sh <root-dir> <sysroot-dir>: Debian's mips64el python3.11 unpacked into
# <root-dir> (with its libc and loader), to run under `qemu-mips64el -L <root-dir>
# <root-dir>/usr/bin/python3.11`. Packages come with `apt-get download` and `dpkg -x` through
# the private mips64el package lists of a sysroot made by make-sysroot.sh; nothing is installed.
# agent/python's interpreter test reads this interpreter's frames when
# STRATA_MIPS64EL_PYTHON_ROOT=<root-dir>. Idempotent.
set -euo pipefail
if [[ $# -ne 2 ]]; then
  echo "usage: $0 <root-dir> <sysroot-dir>" >&2
  exit 2
fi
ROOT=$(mkdir -p "$1" && cd "$1" && pwd)
APTDIR=$(cd "$2/.apt" && pwd)
# shellcheck source=apt-options.sh
source "$(dirname "${BASH_SOURCE[0]}")/apt-options.sh"
[[ -x "$ROOT/usr/bin/python3.11" ]] && { echo "python root $ROOT is ready"; exit 0; }

PKGS=(python3.11-minimal libpython3.11-minimal libpython3.11-stdlib libc6 libgcc-s1 libexpat1
      zlib1g libffi8)
DEBS="$ROOT/.debs"
mkdir -p "$DEBS"
(cd "$DEBS" && apt-get "${APT_OPTS[@]}" -q download "${PKGS[@]}" >"$DEBS/download.log" 2>&1) || {
  cat "$DEBS/download.log" >&2; exit 1; }
for deb in "$DEBS"/*.deb; do
  dpkg -x "$deb" "$ROOT"
done
# The loader's absolute symlink would name the host's /lib under qemu's -L prefix.
if [[ -L "$ROOT/lib64/ld.so.1" ]]; then
  ln -sfn ../lib/mips64el-linux-gnuabi64/ld.so.1 "$ROOT/lib64/ld.so.1"
fi
echo "python root ready: $ROOT ($(du -sh "$ROOT" | cut -f1))"
