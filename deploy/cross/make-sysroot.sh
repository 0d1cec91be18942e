#!/usr/bin/env bash
# make-sysroot.sh <dir>: builds a mips64el sysroot for the static MIPS64 agent build.
#
# Downloads Debian's mips64el -dev packages (and their run-time library packages) with
# `apt-get download` and unpacks them with `dpkg -x` into <dir>. Nothing is installed
# system-wide and the host's dpkg/apt state is never touched: apt runs with a private
# configuration (architecture mips64el, its own package lists, cache and an empty dpkg
# status) kept under <dir>/.apt. `dpkg --add-architecture mips64el` is avoided on purpose:
# libssl3:mips64el exists only at the main-archive version while the host's libssl3 comes
# from the security archive, so multiarch co-installation is refused.
#
# libc6/libc6-dev are left out: the cross toolchain brings its own libc, and the sysroot's
# libc.so linker script names absolute paths that would shadow it.
#
# Idempotent: a stamp file <dir>/.strata-sysroot-done records the package list; when it
# matches, nothing is done. `apt-get update` runs only when the private lists are missing.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 <sysroot-dir>" >&2
  exit 2
fi
SYSROOT=$(mkdir -p "$1" && cd "$1" && pwd)
ARCH=mips64el
TRIPLE=mips64el-linux-gnuabi64

# What the agent (and its tests) link against. The closure is computed below.
ROOTS=(
  libgrpc++-dev libgrpc-dev libprotobuf-dev libabsl-dev libre2-dev libc-ares-dev
  libssl-dev zlib1g-dev libspdlog-dev libfmt-dev libgtest-dev libgmock-dev
  libelf-dev libdw-dev libzstd-dev liblzma-dev libbz2-dev libcli11-dev
)
# Printed by `apt-cache depends` without the arch suffix, so missed by the closure.
EXTRA=(zlib1g zlib1g-dev)
# Never unpacked into the sysroot (see header).
EXCLUDE_RE='^(libc6|libc6-dev|libc-dev-bin|libc-bin|libgcc-s1|libstdc\+\+6|libstdc\+\+-[0-9]+-dev|libgcc-[0-9]+-dev|gcc-[0-9]+-base|linux-libc-dev|libcrypt1|libcrypt-dev|libnsl-dev|libnsl2|libtirpc.*|rpcsvc-proto|debconf|debconf-2.0|perl-base|dpkg|tar|install-info|sensible-utils)$'

STAMP="$SYSROOT/.strata-sysroot-done"
WANT="roots=${ROOTS[*]} extra=${EXTRA[*]} v4"
if [[ -f "$STAMP" ]] && [[ "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "sysroot $SYSROOT is up to date"
  exit 0
fi

APTDIR="$SYSROOT/.apt"
mkdir -p "$APTDIR/lists/partial" "$APTDIR/archives/partial" "$APTDIR/debs" "$APTDIR/etc"
: >"$APTDIR/status"
# Debian's own sources only (other repositories have no mips64el builds).
if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
  cp /etc/apt/sources.list.d/debian.sources "$APTDIR/etc/debian.sources"
else
  cat >"$APTDIR/etc/debian.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
fi
# shellcheck source=apt-options.sh
source "$(dirname "${BASH_SOURCE[0]}")/apt-options.sh"

if ! compgen -G "$APTDIR/lists/*_Packages*" >/dev/null; then
  echo "apt-get update (private mips64el lists in $APTDIR)"
  apt-get "${APT_OPTS[@]}" -q update >"$APTDIR/update.log" 2>&1 || {
    cat "$APTDIR/update.log" >&2; exit 1; }
fi

echo "computing the dependency closure"
mapfile -t PKGS < <(
  {
    apt-cache "${APT_OPTS[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
      --no-breaks --no-replaces --no-enhances "${ROOTS[@]}" |
      sed -n 's/^\([a-z0-9][a-z0-9.+-]*\)\(:mips64el\)\?$/\1/p'
    printf '%s\n' "${EXTRA[@]}" "${ROOTS[@]}"
  } | sort -u | grep -Ev "$EXCLUDE_RE" || true)
# Keep only packages that really exist for mips64el (virtual names are dropped).
REAL=()
for p in "${PKGS[@]}"; do
  if apt-cache "${APT_OPTS[@]}" show --no-all-versions "$p" >/dev/null 2>&1; then
    REAL+=("$p")
  fi
done
echo "${#REAL[@]} packages: ${REAL[*]}"

(cd "$APTDIR/debs" && apt-get "${APT_OPTS[@]}" -q download "${REAL[@]}" >"$APTDIR/download.log" 2>&1) || {
  cat "$APTDIR/download.log" >&2; exit 1; }

for deb in "$APTDIR"/debs/*.deb; do
  dpkg -x "$deb" "$SYSROOT"
done

# Debian's -dev packages use absolute symlinks (e.g. libfoo.so -> /lib/...): make them
# relative to the sysroot so the cross linker does not pick up host files.
while IFS= read -r link; do
  target=$(readlink "$link")
  if [[ "$target" == /* && "$target" != "$SYSROOT"* && -e "$SYSROOT$target" ]]; then
    ln -sfn "$SYSROOT$target" "$link"
  fi
done < <(find "$SYSROOT/usr" "$SYSROOT/lib" -type l 2>/dev/null || true)

# gRPC's CMake package checks that grpc_cpp_plugin exists under the sysroot's prefix; the
# build runs the host's plugin (STRATA_GRPC_CPP_PLUGIN), so point the check at it.
mkdir -p "$SYSROOT/usr/bin"
for tool in grpc_cpp_plugin grpc_csharp_plugin grpc_node_plugin grpc_objective_c_plugin \
            grpc_php_plugin grpc_python_plugin grpc_ruby_plugin protoc; do
  if [[ -x /usr/bin/$tool ]]; then
    ln -sfn "/usr/bin/$tool" "$SYSROOT/usr/bin/$tool"
  fi
done

# Safety net if a libc6-dev slipped in through another route.
rm -f "$SYSROOT/usr/lib/$TRIPLE/libc.so" "$SYSROOT/usr/lib/$TRIPLE/libm.so" \
      "$SYSROOT/usr/lib/$TRIPLE/libc_nonshared.a" "$SYSROOT/usr/lib/$TRIPLE/libpthread.a"

echo "$WANT" >"$STAMP"
echo "sysroot ready: $SYSROOT ($(du -sh "$SYSROOT" | cut -f1))"
