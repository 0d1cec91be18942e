#!/usr/bin/env bash
# The Debian packages, built by CPack from the build tree and handled by the real dpkg in a
# scratch root: install, upgrade from an older version, remove, purge.
#
#   packages_test.sh BUILD_DIR SOURCE_DIR
#
# dpkg runs with --root=R --force-script-chrootless: the maintainer scripts run on this host
# with DPKG_ROOT=R and act under R (they are written for that), so user creation, the state
# directory, systemd enablement (systemctl --root) and purge are exercised for real without a
# chroot. --force-depends: R holds no libraries; the binaries are run with the host's.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d /tmp/strata_packages_test.XXXXXX)
trap 'rm -rf "$work"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
check() { local what=$1; shift; if "$@"; then echo "ok: $what"; else fail "$what"; fi; }

host_etc_strata_before=$([ -e /etc/strata ] && echo yes || echo no)

echo "== building the packages (cpack)"
start=$(date +%s)
(cd "$build" && cpack --config CPackConfig.cmake -B "$work/new" >"$work/cpack.log" 2>&1) ||
  { cat "$work/cpack.log"; fail "cpack"; }
echo "cpack: $(( $(date +%s) - start )) s"
shopt -s nullglob
new_debs=("$work"/new/*.deb)
[ ${#new_debs[@]} -eq 3 ] || fail "expected 3 packages, got: ${new_debs[*]}"
for p in strata-server strata-agent strata-cli; do
  ls "$work"/new/${p}_*.deb >/dev/null || fail "no $p package"
done
check "packaging did not write to the host's /etc/strata" \
  test "$host_etc_strata_before" = yes -o ! -e /etc/strata
version=$(dpkg-deb -f "$work"/new/strata-server_*.deb Version)
echo "version $version"
ls -la "$work"/new/*.deb

# The same packages under an older version number, to upgrade from.
old_version="0.0.1"
mkdir -p "$work/old"
for deb in "$work"/new/*.deb; do
  name=$(dpkg-deb -f "$deb" Package)
  dpkg-deb -R "$deb" "$work/tree-$name"
  sed -i "s/^Version: .*/Version: $old_version/" "$work/tree-$name/DEBIAN/control"
  dpkg-deb -Zgzip -z1 -b "$work/tree-$name" "$work/old/${name}_${old_version}.deb" >/dev/null
  rm -rf "$work/tree-$name"
done

echo "== package contents"
server_files=$(dpkg-deb -c "$work"/new/strata-server_*.deb | awk '{print $6}')
agent_files=$(dpkg-deb -c "$work"/new/strata-agent_*.deb | awk '{print $6}')
cli_files=$(dpkg-deb -c "$work"/new/strata-cli_*.deb | awk '{print $6}')
for f in ./usr/bin/strata-server ./usr/lib/systemd/system/strata-server.service \
         ./etc/strata/server.toml; do
  grep -qx "$f" <<<"$server_files" || fail "strata-server lacks $f"
done
for f in ./usr/bin/strata-agent ./usr/lib/strata/libstrata_inproc.so \
         ./usr/lib/systemd/system/strata-agent.service ./etc/strata/agent.toml; do
  grep -qx "$f" <<<"$agent_files" || fail "strata-agent lacks $f"
done
for f in ./usr/bin/strata ./etc/strata/cli.toml; do
  grep -qx "$f" <<<"$cli_files" || fail "strata-cli lacks $f"
done
echo "ok: files in each package"
for p in server agent cli; do
  case $p in server) conf=server.toml ;; agent) conf=agent.toml ;; cli) conf=cli.toml ;; esac
  dpkg-deb --ctrl-tarfile "$work"/new/strata-${p}_*.deb | tar -xO ./conffiles |
    grep -qx "/etc/strata/$conf" || fail "strata-$p: /etc/strata/$conf is not a conffile"
done
echo "ok: /etc/strata files are conffiles"
depends=$(dpkg-deb -f "$work"/new/strata-server_*.deb Depends)
for lib in libgrpc++ libprotobuf libc6 passwd; do
  grep -q "$lib" <<<"$depends" || fail "strata-server Depends lacks $lib: $depends"
done
echo "ok: strata-server depends on its libraries ($(tr ',' '\n' <<<"$depends" | wc -l) entries)"
tmp_bin="$work/extract"
dpkg-deb -x "$work"/new/strata-server_*.deb "$tmp_bin"
! readelf -S "$tmp_bin/usr/bin/strata-server" | grep -qE '\.(debug_info|symtab)' ||
  fail "strata-server is not stripped"
echo "ok: binaries stripped ($(stat -c %s "$tmp_bin/usr/bin/strata-server") bytes for strata-server)"

echo "== scratch root"
R="$work/root"
mkdir -p "$R/var/lib/dpkg/info" "$R/var/lib/dpkg/updates" "$R/var/lib/dpkg/triggers" "$R/etc"
touch "$R/var/lib/dpkg/status" "$R/var/lib/dpkg/available"
# A fresh system's account files, as debootstrap leaves them.
printf 'root:x:0:0:root:/root:/bin/bash\n' >"$R/etc/passwd"
printf 'root:x:0:\n' >"$R/etc/group"
printf 'root:*:19000:0:99999:7:::\n' >"$R/etc/shadow"
printf 'root:*::\n' >"$R/etc/gshadow"
chmod 640 "$R/etc/shadow" "$R/etc/gshadow"
cp /etc/login.defs "$R/etc/login.defs"
DPKG=(dpkg --root="$R" --force-script-chrootless --force-depends --force-confdef
      --force-confold --force-unsafe-io --log="$work/dpkg.log")
status_of() { dpkg-query --admindir="$R/var/lib/dpkg" -W -f='${db:Status-Abbrev}${Version}' "$1" 2>/dev/null || true; }

echo "== install $old_version"
"${DPKG[@]}" -i "$work"/old/*.deb >"$work/install.log" 2>&1 || { cat "$work/install.log"; fail "dpkg -i old"; }
for p in strata-server strata-agent strata-cli; do
  s=$(status_of $p)
  [[ "$s" == "ii "*"$old_version" ]] || fail "$p status after install: '$s'"
done
echo "ok: all three installed ($old_version)"
for f in usr/bin/strata-server usr/bin/strata-agent usr/bin/strata usr/lib/strata/libstrata_inproc.so \
         usr/lib/systemd/system/strata-server.service usr/lib/systemd/system/strata-agent.service \
         etc/strata/server.toml etc/strata/agent.toml etc/strata/cli.toml; do
  [ -e "$R/$f" ] || fail "missing /$f after install"
done
echo "ok: files installed"
conffiles=$(dpkg-query --admindir="$R/var/lib/dpkg" -W -f='${Conffiles}\n' strata-server strata-agent strata-cli)
for c in server agent cli; do grep -q "/etc/strata/$c.toml" <<<"$conffiles" || fail "dpkg does not track $c.toml"; done
echo "ok: dpkg tracks the conffiles"
user_line=$(grep '^strata:' "$R/etc/passwd") || fail "postinst did not create the user strata"
uid=$(cut -d: -f3 <<<"$user_line")
[ "$uid" -gt 0 ] && [ "$uid" -lt 1000 ] || fail "strata is not a system user: $user_line"
[[ "$user_line" == *:/var/lib/strata:/usr/sbin/nologin ]] || fail "strata home/shell: $user_line"
grep -q '^strata:' "$R/etc/group" || fail "no group strata"
echo "ok: system user created: $user_line"
[ "$(stat -c '%u %a' "$R/var/lib/strata")" = "$uid 750" ] ||
  fail "/var/lib/strata: $(stat -c '%u %a' "$R/var/lib/strata")"
echo "ok: /var/lib/strata owned by strata, mode 750"
[ -L "$R/etc/systemd/system/multi-user.target.wants/strata-server.service" ] ||
  fail "strata-server.service not enabled"
[ ! -e "$R/etc/systemd/system/multi-user.target.wants/strata-agent.service" ] ||
  fail "strata-agent.service enabled before it is configured"
echo "ok: strata-server.service enabled (systemctl --root), strata-agent.service left disabled"
# The installed binaries run (host libraries) and read the installed configs.
"$R/usr/bin/strata-server" --config "$R/etc/strata/server.toml" --print-config >"$work/server.conf" ||
  fail "installed strata-server cannot read /etc/strata/server.toml"
grep -qx 'data = "/var/lib/strata"' "$work/server.conf" || fail "server.toml data dir"
"$R/usr/bin/strata-agent" --config "$R/etc/strata/agent.toml" --print-config >/dev/null ||
  fail "installed strata-agent cannot read /etc/strata/agent.toml"
"$R/usr/bin/strata" --config "$R/etc/strata/cli.toml" --print-config >/dev/null ||
  fail "installed strata cannot read /etc/strata/cli.toml"
echo "ok: installed binaries read the installed configs"

echo "== upgrade $old_version -> $version"
sed -i 's/^log-level = "info"/log-level = "debug"  # edited by the administrator/' "$R/etc/strata/server.toml"
echo "profiles" >"$R/var/lib/strata/STRATA-test-marker"
"${DPKG[@]}" -i "$work"/new/*.deb >"$work/upgrade.log" 2>&1 || { cat "$work/upgrade.log"; fail "dpkg -i new"; }
for p in strata-server strata-agent strata-cli; do
  s=$(status_of $p)
  [[ "$s" == "ii "*"$version" ]] || fail "$p status after upgrade: '$s'"
done
echo "ok: upgraded to $version"
grep -q 'edited by the administrator' "$R/etc/strata/server.toml" || fail "upgrade lost the administrator's edit"
echo "ok: the edited conffile was kept"
[ -f "$R/var/lib/strata/STRATA-test-marker" ] || fail "upgrade lost /var/lib/strata"
[ "$(grep -c '^strata:' "$R/etc/passwd")" = 1 ] && grep -q "^strata:x:$uid:" "$R/etc/passwd" ||
  fail "upgrade changed the user"
echo "ok: data and user unchanged"

echo "== remove"
mkdir -p "$R/var/lib/private/strata-agent/spool"
ln -sfn private/strata-agent "$R/var/lib/strata-agent"
echo batch >"$R/var/lib/private/strata-agent/spool/segment"
"${DPKG[@]}" -r strata-server strata-agent strata-cli >"$work/remove.log" 2>&1 || { cat "$work/remove.log"; fail "dpkg -r"; }
for p in strata-server strata-agent strata-cli; do
  s=$(status_of $p)
  [[ "$s" == "rc "* ]] || fail "$p status after remove: '$s'"
done
for f in usr/bin/strata-server usr/bin/strata-agent usr/bin/strata \
         usr/lib/systemd/system/strata-server.service; do
  [ ! -e "$R/$f" ] || fail "/$f left after remove"
done
[ -f "$R/var/lib/strata/STRATA-test-marker" ] || fail "remove deleted /var/lib/strata"
[ -f "$R/var/lib/strata-agent/spool/segment" ] || fail "remove deleted the agent's spool"
[ -f "$R/etc/strata/server.toml" ] || fail "remove deleted the conffile"
[ ! -e "$R/etc/systemd/system/multi-user.target.wants/strata-server.service" ] ||
  fail "strata-server.service still enabled after remove"
echo "ok: remove: binaries and units gone; data, spool and configs kept; unit disabled"

echo "== purge"
"${DPKG[@]}" -P strata-server strata-agent strata-cli >"$work/purge.log" 2>&1 || { cat "$work/purge.log"; fail "dpkg -P"; }
for p in strata-server strata-agent strata-cli; do
  [ -z "$(status_of $p)" ] || [[ "$(status_of $p)" == "un "* ]] || fail "$p after purge: $(status_of $p)"
done
[ ! -e "$R/var/lib/strata" ] || fail "purge kept /var/lib/strata"
[ ! -e "$R/var/lib/strata-agent" ] && [ ! -e "$R/var/lib/private/strata-agent" ] || fail "purge kept the spool"
for c in server agent cli; do [ ! -e "$R/etc/strata/$c.toml" ] || fail "purge kept $c.toml"; done
echo "ok: purge: /var/lib/strata, the spool and /etc/strata/*.toml gone"
grep -q '^strata:' "$R/etc/passwd" && echo "note: the strata user is kept after purge (files elsewhere may belong to it)"

echo "== reinstall after purge"
"${DPKG[@]}" -i "$work"/new/strata-server_*.deb >"$work/reinstall.log" 2>&1 || { cat "$work/reinstall.log"; fail "reinstall"; }
[ -d "$R/var/lib/strata" ] && [ "$(stat -c %u "$R/var/lib/strata")" = "$uid" ] || fail "reinstall: state directory"
echo "ok: reinstalled onto the kept user ($uid)"
echo "PASS"
