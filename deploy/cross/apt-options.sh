# Sourced by make-sysroot.sh, make-python-root.sh, make-python-next-root.sh, make-jdk-root.sh
# and make-go-root.sh:
# APT_OPTS, apt-get/apt-cache options for a private package state under $APTDIR (lists, cache,
# an empty dpkg status; Debian's sources from $APTDIR/etc, see private_apt_state) for
# architecture $APT_ARCH (default mips64el), so that the host's dpkg/apt state is never touched.
APT_ARCH=${APT_ARCH:-mips64el}
APT_OPTS=(
  -o "APT::Architecture=$APT_ARCH" -o "APT::Architectures::=$APT_ARCH"
  -o "Dir::State::Lists=$APTDIR/lists" -o "Dir::State::status=$APTDIR/status"
  -o "Dir::Cache=$APTDIR" -o "Dir::Cache::archives=$APTDIR/archives"
  -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache="
  -o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$APTDIR/etc"
  -o "Acquire::Languages=none" -o "APT::Get::List-Cleanup=0"
  -o "Debug::NoLocking=1"
)
# private_apt_state SUITE...: $APTDIR's folders, an empty dpkg status, and its only sources file
# naming Debian's main archive for those suites, signed by Debian's archive keyring.
private_apt_state() {
  mkdir -p "$APTDIR/lists/partial" "$APTDIR/archives/partial" "$APTDIR/debs" "$APTDIR/etc"
  : >"$APTDIR/status"
  rm -f "$APTDIR/etc/"*.sources
  printf '%s\n' "Types: deb" "URIs: http://deb.debian.org/debian" "Suites: $*" \
    "Components: main" "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" \
    >"$APTDIR/etc/debian.sources"
}
# unpack_packages ROOT SUITES PKG...: PKG... for $APT_ARCH from Debian's SUITES (one word, or
# several in one quoted argument) through $APTDIR's private state, unpacked into ROOT with
# `dpkg -x`; the lists and the packages are removed after. Prints apt's log where a step fails.
unpack_packages() {
  local root=$1 suites=$2 deb
  shift 2
  # shellcheck disable=SC2086  # the suites, one word each
  private_apt_state $suites
  apt-get "${APT_OPTS[@]}" -q update >"$APTDIR/update.log" 2>&1 || {
    cat "$APTDIR/update.log" >&2; return 1; }
  (cd "$APTDIR/debs" && apt-get "${APT_OPTS[@]}" -q download "$@" >"$APTDIR/download.log" 2>&1) ||
    { cat "$APTDIR/download.log" >&2; return 1; }
  for deb in "$APTDIR"/debs/*.deb; do
    dpkg -x "$deb" "$root"
  done
  rm -rf "$APTDIR/lists" "$APTDIR/debs"
}
