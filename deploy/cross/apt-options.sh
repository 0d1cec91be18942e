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
