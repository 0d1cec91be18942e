#!/usr/bin/env bash
# make-go-root.sh <dir> <version>: Debian's Go toolchain <version> (1.21, 1.22 or 1.23 from
# bookworm-backports, newer ones such as 1.27 from unstable: golang-<version>-go and the
# golang-<version>-src it needs; Go's toolchain is statically linked and runs on bookworm)
# unpacked into <dir>; prints its GOROOT (<dir>/usr/lib/go-<version>) as the last line. The
# tests of Go support build their programs with it besides Debian 12's own Go 1.19.
#
# Packages come with `apt-get download` and `dpkg -x` through a private package state in
# <dir>/.apt (lists of bookworm-backports and unstable only, its own cache, an empty dpkg
# status): nothing is installed and the host's apt/dpkg state is never touched. Idempotent: a
# version already unpacked is only printed; the lists are fetched once.
set -euo pipefail
if [[ $# -ne 2 ]] || [[ ! $2 =~ ^1\.[0-9]+$ ]]; then
  echo "usage: $0 <dir> <version, e.g. 1.23>" >&2
  exit 2
fi
ROOT=$(mkdir -p "$1" && cd "$1" && pwd)
VERSION=$2
GOROOT="$ROOT/usr/lib/go-$VERSION"
if [[ -x "$GOROOT/bin/go" && -f "$GOROOT/src/runtime/symtab.go" ]]; then
  echo "$GOROOT"
  exit 0
fi

APTDIR="$ROOT/.apt"
APT_ARCH=$(dpkg --print-architecture)
# shellcheck source=apt-options.sh
source "$(dirname "${BASH_SOURCE[0]}")/apt-options.sh"
private_apt_state bookworm-backports unstable
# Run at configure time: an unreachable mirror fails soon, and the tests that need Go skip.
APT_OPTS+=(-o "Acquire::http::Timeout=20" -o "Acquire::Retries=0")

if ! compgen -G "$APTDIR/lists/*unstable*_Packages*" >/dev/null; then
  # (apt-get update succeeds even when nothing could be fetched.)
  if ! apt-get "${APT_OPTS[@]}" -q update >"$APTDIR/update.log" 2>&1 ||
     ! compgen -G "$APTDIR/lists/*unstable*_Packages*" >/dev/null; then
    echo "make-go-root.sh: no package lists from bookworm-backports and unstable:" >&2
    grep -E '^(W|E):' "$APTDIR/update.log" >&2 || cat "$APTDIR/update.log" >&2
    exit 1
  fi
fi
PKGS=("golang-$VERSION-go" "golang-$VERSION-src")
(cd "$APTDIR/debs" && apt-get "${APT_OPTS[@]}" -q download "${PKGS[@]}" \
   >"$APTDIR/download-$VERSION.log" 2>&1) || { cat "$APTDIR/download-$VERSION.log" >&2; exit 1; }
for p in "${PKGS[@]}"; do
  for deb in "$APTDIR/debs/${p}"_*.deb; do
    dpkg -x "$deb" "$ROOT"
  done
done
# Debian links the GOROOT's src, misc, ... into /usr/share/go-<version> by absolute paths:
# point them inside <dir>.
while IFS= read -r link; do
  target=$(readlink "$link")
  if [[ "$target" == /* && -e "$ROOT$target" ]]; then
    ln -sfn "$ROOT$target" "$link"
  fi
done < <(find "$ROOT/usr/lib/go-$VERSION" -type l)
[[ -x "$GOROOT/bin/go" && -f "$GOROOT/src/runtime/symtab.go" ]] || {
  echo "make-go-root.sh: $GOROOT is incomplete after unpacking" >&2; exit 1; }
rm -f "$APTDIR/debs/golang-$VERSION-"*.deb
echo "$GOROOT"
