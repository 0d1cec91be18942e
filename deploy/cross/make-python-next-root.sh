#!/usr/bin/env bash
# make-python-next-root.sh <root-dir>: the CPython versions the agent reads that bookworm does not
# ship (python3.14 and python3.15, from Debian unstable), unpacked into <root-dir> with
# unstable's C library and loader, to run as `<root-dir>/usr/lib64/ld-linux-x86-64.so.2
# --library-path <root-dir>/usr/lib/x86_64-linux-gnu <root-dir>/usr/bin/python3.X`. Packages come
# with `apt-get download` and `dpkg -x` through private package lists (apt-options.sh, for amd64);
# nothing is installed. tests/e2e/python profiles these interpreters when <root-dir> is the
# x86-64 build's python-next/. Idempotent.
set -euo pipefail
if [[ $# -ne 1 ]]; then
  echo "usage: $0 <root-dir>" >&2
  exit 2
fi
VERSIONS=(3.14 3.15)
ROOT=$(mkdir -p "$1" && cd "$1" && pwd)
ready=1
for v in "${VERSIONS[@]}"; do [[ -x "$ROOT/usr/bin/python$v" ]] || ready=0; done
((ready)) && { echo "python root $ROOT is ready"; exit 0; }
APTDIR="$ROOT/.apt"
APT_ARCH=amd64
# shellcheck source=apt-options.sh
source "$(dirname "${BASH_SOURCE[0]}")/apt-options.sh"
PKGS=(libc6 libexpat1 zlib1g libffi8 libzstd1 libgcc-s1)
for v in "${VERSIONS[@]}"; do
  PKGS+=("python$v-minimal" "libpython$v-minimal" "libpython$v-stdlib")
done
unpack_packages "$ROOT" unstable "${PKGS[@]}"
echo "python root ready: $ROOT ($(du -sh "$ROOT" | cut -f1))"
