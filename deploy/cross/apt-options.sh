# Sourced by make-sysroot.sh and make-python-root.sh: APT_OPTS, apt-get/apt-cache options for
# a private mips64el package state under $APTDIR (lists, cache, an empty dpkg status; Debian's
# sources from $APTDIR/etc), so that the host's dpkg/apt state is never touched.
APT_OPTS=(
  -o "APT::Architecture=mips64el" -o "APT::Architectures::=mips64el"
  -o "Dir::State::Lists=$APTDIR/lists" -o "Dir::State::status=$APTDIR/status"
  -o "Dir::Cache=$APTDIR" -o "Dir::Cache::archives=$APTDIR/archives"
  -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache="
  -o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$APTDIR/etc"
  -o "Acquire::Languages=none" -o "APT::Get::List-Cleanup=0"
  -o "Debug::NoLocking=1"
)
