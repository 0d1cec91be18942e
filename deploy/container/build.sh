#!/usr/bin/env bash
# Builds the strata-server and strata-agent container images from the build tree, FROM
# scratch: each image holds its component's installed files (cmake --install, the same rules
# as the Debian packages), the shared libraries they link (found with ldd) and the dynamic
# loader. No registry is needed. Uses podman (installed from Debian if missing).
#
#   deploy/container/build.sh [BUILD_DIR] [--check]
#
# --check: run the server image once and ask its /healthz. Where podman cannot start a
# container (a sandbox that refuses setrlimit, which every OCI runtime calls), the image's
# root filesystem is run with chroot instead, which checks the same files; the script says
# which it did.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$(pwd)
build=${1:-build}
check=0
[[ "${2:-}" == --check || "${1:-}" == --check ]] && check=1
[[ "$build" == --check ]] && build=build
build=$(cd "$build" && pwd)
version=$(sed -n 's/^project(strata VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")
work="$build/container"

if ! command -v podman >/dev/null 2>&1; then
  echo "container: installing podman (Debian)"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends podman >/dev/null
fi
# vfs: works on any filesystem, also inside another container.
PODMAN=(podman --storage-driver vfs)

# stage COMPONENT: the component's files, libraries and loader into $work/rootfs-NAME.
stage() {
  local component=$1 name=${1#strata-} dir
  dir="$work/rootfs-$name"
  rm -rf "$dir"
  DESTDIR="$dir" cmake --install "$build" --component "$component" --prefix /usr --strip >/dev/null
  rm -rf "$dir/usr/share/doc" "$dir/usr/lib/systemd"
  local libs
  libs=$(find "$dir/usr/bin" "$dir/usr/lib" -type f -perm -u+x 2>/dev/null | xargs -r ldd 2>/dev/null |
    grep -o '/[^ ]*' | sort -u)
  for lib in $libs; do
    mkdir -p "$dir$(dirname "$lib")"
    cp -L "$lib" "$dir$lib"
  done
  mkdir -p "$dir/etc" "$dir/tmp" "$dir/var/lib"
  chmod 1777 "$dir/tmp"
  # The state directory, copied into the image separately so that it can belong to its user.
  rm -rf "$work/state-$name" && mkdir -p "$work/state-$name/strata"
  printf 'root:x:0:0:root:/:/nonexistent\nstrata:x:65532:65532:strata:/var/lib/strata:/nonexistent\n' >"$dir/etc/passwd"
  printf 'root:x:0:\nstrata:x:65532:\n' >"$dir/etc/group"
  echo "container: $component: $(du -sh "$dir" | cut -f1) in $(find "$dir" -type f | wc -l) files"
}

stage strata-server
stage strata-agent
cp "$root/deploy/container/Containerfile.server" "$root/deploy/container/Containerfile.agent" "$work/"
for name in server agent; do
  "${PODMAN[@]}" build --isolation chroot -q -f "$work/Containerfile.$name" \
    -t "localhost/strata-$name:$version" "$work" >/dev/null
  size=$("${PODMAN[@]}" image inspect "localhost/strata-$name:$version" --format '{{.Size}}')
  echo "container: localhost/strata-$name:$version built ($((size / 1024 / 1024)) MiB)"
done
echo "container: save with: podman --storage-driver vfs save localhost/strata-server:$version -o strata-server.tar"

[ "$check" = 1 ] || exit 0

# The server image once: its /healthz.
port=$((20000 + RANDOM % 20000))
log="$work/check.log"
if "${PODMAN[@]}" run --rm --network host localhost/strata-server:$version --help >/dev/null 2>"$log"; then
  mode="podman run"
  "${PODMAN[@]}" run -d --name strata-server-check --network host --tmpfs /var/lib/strata:uid=65532 \
    localhost/strata-server:$version --listen 127.0.0.1:0 --http "127.0.0.1:$port" \
    --data /var/lib/strata/store >/dev/null
  stop() { "${PODMAN[@]}" rm -f strata-server-check >/dev/null 2>&1 || true; }
else
  echo "container: podman cannot run containers here: $(tail -1 "$log")"
  echo "container: running the image's root filesystem with chroot instead"
  mode="chroot into the image's root filesystem"
  rootfs="$work/check-rootfs"
  rm -rf "$rootfs" && mkdir -p "$rootfs"
  cid=$("${PODMAN[@]}" create localhost/strata-server:$version)
  "${PODMAN[@]}" export "$cid" | tar -x -C "$rootfs"
  "${PODMAN[@]}" rm "$cid" >/dev/null
  mkdir -p "$rootfs/proc" "$rootfs/dev"
  mount -t proc proc "$rootfs/proc"
  mount --bind /dev "$rootfs/dev"
  chroot --userspec=65532:65532 "$rootfs" /usr/bin/strata-server --listen 127.0.0.1:0 \
    --http "127.0.0.1:$port" --data /var/lib/strata/store >"$work/server.log" 2>&1 &
  pid=$!
  stop() {
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    umount -l "$rootfs/proc" || true
    umount -l "$rootfs/dev" || true
  }
fi
trap stop EXIT
for _ in $(seq 1 50); do
  if body=$(curl -fsS "http://127.0.0.1:$port/healthz" 2>/dev/null); then
    echo "container: $mode: GET /healthz -> $body"
    exit 0
  fi
  sleep 0.2
done
echo "container: $mode: /healthz did not answer" >&2
cat "$work/server.log" 2>/dev/null >&2 || true
exit 1
