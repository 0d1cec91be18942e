#!/usr/bin/env bash
# The systemd units: `systemd-analyze verify` on the units as installed (cmake --install into
# a scratch root, so ExecStart's binaries exist there), with any warning a failure; then the
# offline security score of each, printed for the record, and the hardening the units promise.
#
#   systemd_units_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)

if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "SKIP: systemd-analyze is not installed (Debian package systemd)"
  exit 0
fi
work=$(mktemp -d /tmp/strata_units_test.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

R="$work/root"
for c in strata-server strata-agent; do
  DESTDIR="$R" cmake --install "$build" --component "$c" --prefix /usr >/dev/null
done
units="$R/usr/lib/systemd/system"
[ -f "$units/strata-server.service" ] && [ -f "$units/strata-agent.service" ] ||
  fail "units not installed under $units"
# verify resolves the units' dependencies (multi-user.target, sysinit.target, ...) in the
# root: the host's stock targets, copied beside ours.
cp -n /usr/lib/systemd/system/*.target "$units/" 2>/dev/null || cp -n /lib/systemd/system/*.target "$units/"

out=$(systemd-analyze verify --root="$R" strata-server.service strata-agent.service 2>&1) ||
  { echo "$out"; fail "systemd-analyze verify"; }
[ -z "$out" ] || { echo "$out"; fail "systemd-analyze verify printed warnings"; }
echo "ok: systemd-analyze verify strata-server.service strata-agent.service"

# A unit with a misspelt key must fail here, or the check above proves nothing.
sed 's/^ProtectClock=yes/ProtectClok=yes/' "$units/strata-server.service" >"$units/strata-broken.service"
out=$(systemd-analyze verify --root="$R" strata-broken.service 2>&1) || true
grep -q "Unknown key" <<<"$out" || fail "verify did not catch a misspelt key: $out"
rm "$units/strata-broken.service"
echo "ok: a misspelt key is caught"

for u in strata-server strata-agent; do
  score=$(systemd-analyze security --offline=yes --root="$R" "$u.service" 2>/dev/null |
    sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\) \([A-Z]*\).*/\1 \2/p')
  echo "systemd-analyze security $u.service: exposure $score (0 best, 10 worst)"
  [ -n "$score" ] || fail "no security score for $u"
done

server="$units/strata-server.service"
for line in User=strata NoNewPrivileges=yes ProtectSystem=strict StateDirectory=strata \
            CapabilityBoundingSet= ProtectHome=yes PrivateTmp=yes; do
  grep -qx "$line" "$server" || fail "strata-server.service lacks $line"
done
agent="$units/strata-agent.service"
caps="CAP_SYS_PTRACE CAP_DAC_READ_SEARCH CAP_IPC_LOCK CAP_PERFMON CAP_SYSLOG"
for line in "AmbientCapabilities=$caps" "CapabilityBoundingSet=$caps" NoNewPrivileges=yes \
            ProtectSystem=strict DynamicUser=yes StateDirectory=strata-agent; do
  grep -qx "$line" "$agent" || fail "strata-agent.service lacks $line"
done
grep -q '^User=root' "$agent" && fail "strata-agent.service runs as root"
echo "ok: hardening settings present"

# The server under what the unit imposes, emulated without systemd (no service manager runs
# here): its own uid, no capabilities, no new privileges, the whole file system read-only
# except its state directory (ProtectSystem=strict + StateDirectory=). It must start, answer
# /healthz and stop cleanly.
if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null || ! command -v curl >/dev/null; then
  echo "SKIP: the restricted server run needs root, unshare and curl"
  echo "PASS"
  exit 0
fi
state="$work/state" logs="$work/logs"
mkdir -p "$state" "$logs"
chown 61720:61720 "$state" "$logs"
chmod 755 "$work"
port=$((21000 + RANDOM % 20000))
unshare -m --propagation private sh -c '
  set -e
  mount --bind "$1" "$1"; mount --bind "$2" "$2"
  mount -o remount,bind,ro /
  mount -o remount,bind,rw "$1"; mount -o remount,bind,rw "$2"
  if touch /etc/strata-write-test 2>/dev/null; then echo "root file system is writable"; exit 1; fi
  setpriv --reuid=61720 --regid=61720 --clear-groups --no-new-privs --inh-caps=-all     --bounding-set=-all -- "$3" --listen 127.0.0.1:0 --http "127.0.0.1:$4"     --data "$1/store" >"$2/server.log" 2>&1 &
  pid=$!
  for i in $(seq 1 100); do
    if curl -fsS "http://127.0.0.1:$4/healthz" >"$2/healthz" 2>/dev/null; then break; fi
    sleep 0.2
  done
  kill -TERM $pid; wait $pid
' restricted "$state" "$logs" "$R/usr/bin/strata-server" "$port" ||
  { cat "$logs/server.log"; fail "the restricted server run"; }
[ "$(cat "$logs/healthz" 2>/dev/null)" = ok ] || { cat "$logs/server.log"; fail "no /healthz"; }
grep -q "stopped cleanly" "$logs/server.log" || { cat "$logs/server.log"; fail "unclean stop"; }
[ -f "$state/store/CURRENT" ] || fail "no store in the state directory"
echo "ok: strata-server as uid 61720, no capabilities, no new privileges, read-only / but its state directory: /healthz ok, stopped cleanly"
echo "PASS"
