# Sourced by make-sysroot.sh, make-python-root.sh and make-go-root.sh: APT_OPTS, apt-get/apt-cache
# options for a private package state under $APTDIR (lists, cache, an empty dpkg status; Debian's
# sources from $APTDIR/etc) for architecture $APT_ARCH (default mips64el), so that the host's
# dpkg/apt state is never touched.
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
