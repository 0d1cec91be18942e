#!/usr/bin/env bash
# Installs the Debian 12 packages Strata builds and tests with. Idempotent: packages
# already present are skipped, so a second run costs one dpkg query.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config ccache git clang libclang-rt-14-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  librocksdb-dev libboost-dev libboost-system-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev libabsl-dev libcli11-dev
  libelf-dev libdw-dev libunwind-dev zlib1g-dev
  g++-mips64el-linux-gnuabi64 g++-mips64-linux-gnuabi64 qemu-user
  procps curl ca-certificates dpkg-dev openssl libssl-dev
  golang-go chromium libxml2-utils libfaketime
  systemd yamllint python3-yaml linux-perf nodejs openjdk-17-jdk-headless
  libdebuginfod-dev debuginfod elfutils libc6-dbg libstdc++6-12-dbg liblzma-dev llvm
  etcd-server iproute2
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
