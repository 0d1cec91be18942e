#!/usr/bin/env bash
# The agent's memory during a long server outage, and exact totals afterwards, one scripted
# run with the real binaries:
#  - a strata-server on a loopback port and a fresh data directory, the demo workload, and
#    strata-agent on it with a durable spool (--spool-dir) and 1 s intervals (an outage of
#    M minutes piles up about M*60 batches);
#  - once the server holds samples, the server is stopped (SIGTERM) for MINUTES minutes;
#    every STEP seconds (30) the agent's RSS (VmRSS), its open files and threads, the spool's
#    bytes (its files' sizes, and du -sk of the directory) and the batches spooled since the
#    outage began are recorded;
#  - the server is started again on the same data directory and port; once the agent is back
#    and the server holds every sample the agent had spooled, the agent is stopped (SIGTERM:
#    it ships its last interval and waits for the acknowledgement) and the server's total must
#    equal the samples the agent counted ("stopping: N samples"), none lost, none twice.
# Anchor from the same run: the agent's RSS while connected, before the outage.
#
# Usage: tests/bench/faults/outage_rss.sh [MINUTES=30] [BIN_DIR=build/bin]
#   env: STEP (seconds between samples, 30), INTERVAL (agent --interval, 1), HZ (99),
#        KEEP=1 keeps the temporary directory (logs, spool, data) and prints its path
# Exit status 1 when the totals differ (or the agent could not deliver its spool).
set -euo pipefail
minutes=${1:-30}
bin=$(cd "${2:-$(dirname "$0")/../../../build/bin}" && pwd)
step=${STEP:-30}
interval=${INTERVAL:-1}
hz=${HZ:-99}
service=outage
work=$(mktemp -d /tmp/strata-outage.XXXXXX)
cleanup() {
  local rc=$?
  kill -KILL $(jobs -p) 2>/dev/null || true
  wait 2>/dev/null || true
  if [[ $rc -ne 0 ]]; then
    for f in agent server0 server1; do
      [[ -f $work/$f.log ]] || continue
      echo "--- tail of $f.log" >&2
      tail -n 15 "$work/$f.log" >&2
    done
  fi
  if [[ -n ${KEEP:-} ]]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
die() { echo "outage_rss: $*" >&2; exit 1; }

# Sends TERM, waits up to $2 seconds, then KILL; the process's exit status.
stop() {
  local pid=$1 timeout=$2 rc=0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq $((timeout * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" || rc=$?
  return $rc
}
start_server() {  # LISTEN LOG: sets $server and $port
  "$bin/strata-server" --listen "$1" --http '' --data "$work/data" >"$work/$2" 2>&1 &
  server=$!
  for _ in $(seq 300); do grep -q "ready on port" "$work/$2" && break; sleep 0.1; done
  port=$(sed -n 's/.*ready on port \([0-9]*\).*/\1/p' "$work/$2")
  [[ -n $port ]] || die "server did not start ($1)"
}
# The server's total for the service (0 while it has none or does not answer).
total() {
  local out
  out=$("$bin/strata" --server "127.0.0.1:$port" --json --timeout 10 services 2>/dev/null) || out='{}'
  python3 -c '
import json, sys
try: r = json.loads(sys.argv[2])
except ValueError: r = {}
print(sum(int(s.get("total_samples", 0)) for s in r.get("services", []) if s.get("name") == sys.argv[1]))
' "$service" "$out"
}
rss_kib() { awk '$1 == "VmRSS:" {print $2}' "/proc/$1/status"; }
hwm_kib() { awk '$1 == "VmHWM:" {print $2}' "/proc/$1/status"; }
# "spooled batch N (M samples)" lines of the agent's log after line $1: count and samples.
spooled_after() {
  tail -n +"$(($1 + 1))" "$work/agent.log" |
    sed -n 's/.*spooled batch \([0-9]*\) (\([0-9]*\) samples).*/\2/p' |
    awk '{n++; s += $1} END {printf "%d %d\n", n, s}'
}
lines() { wc -l <"$work/agent.log"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}'; }

start_server 127.0.0.1:0 server0.log
STRATA_SERVICE=$service "$bin/demo_service" >"$work/demo.log" 2>&1 &
demo=$!
for _ in $(seq 300); do grep -q ready "$work/demo.log" && break; sleep 0.1; done
"$bin/strata-agent" --server "127.0.0.1:$port" --pid "$demo" --frequency "$hz" \
  --interval "$interval" --agent-id outage-rss --spool-dir "$work/spool" --flush-timeout 120 \
  --log-level debug >"$work/agent.log" 2>&1 &
agent=$!

# Connected and delivering: the server holds samples; then a settled RSS while connected.
for _ in $(seq 60); do (( $(total) > 0 )) && break; sleep 1; done
(( $(total) > 0 )) || die "the server holds no samples after 60 s"
sleep 10
rss_connected=$(rss_kib "$agent")
held_before=$(total)

# The outage.
stop "$server" 30 || true
outage_t0=$(now)
outage_line=$(lines)
echo "outage: server stopped at $(date -u +%H:%M:%S) for $minutes min; agent pid $agent," \
  "interval $interval s, $hz Hz; samples held before: $held_before"
printf '%9s %9s %9s %6s %8s %12s %8s %9s %10s\n' elapsed_s rss_KiB hwm_KiB fds threads \
  spool_bytes du_KiB segments batches
samples=()  # "elapsed rss bytes batches"
n=$(( minutes * 60 / step ))
for i in $(seq 0 "$n"); do
  target=$(awk -v t="$outage_t0" -v d=$((i * step)) 'BEGIN {printf "%.3f", t + d}')
  wait_s=$(awk -v t="$target" -v n="$(now)" 'BEGIN {d = t - n; printf "%.3f", (d > 0 ? d : 0)}')
  sleep "$wait_s"
  kill -0 "$agent" 2>/dev/null || die "the agent exited during the outage"
  rss=$(rss_kib "$agent"); hwm=$(hwm_kib "$agent")
  fds=$(ls "/proc/$agent/fd" | wc -l); threads=$(ls "/proc/$agent/task" | wc -l)
  bytes=$(find "$work/spool" -type f -printf '%s\n' | awk '{b += $1} END {print b + 0}')
  du_kib=$(du -sk "$work/spool" | cut -f1)
  segments=$(find "$work/spool" -name 'batches-*.log' | wc -l)
  read -r batches _ < <(spooled_after "$outage_line")
  printf '%9s %9d %9d %6d %8d %12d %8d %9d %10d\n' "$(since "$outage_t0")" "$rss" "$hwm" "$fds" \
    "$threads" "$bytes" "$du_kib" "$segments" "$batches"
  samples+=("$(since "$outage_t0") $rss $bytes $batches $du_kib")
done
read -r outage_batches outage_samples < <(spooled_after "$outage_line")
outage_s=$(since "$outage_t0")

# The server back on the same data and port; the agent reconnects and delivers its spool.
connects_before=$(grep -c "connected to strata-server" "$work/agent.log" || true)
restart_t0=$(now)
start_server "127.0.0.1:$port" server1.log
for _ in $(seq 1200); do
  (( $(grep -c "connected to strata-server" "$work/agent.log" || true) > connects_before )) && break
  sleep 0.1
done
(( $(grep -c "connected to strata-server" "$work/agent.log" || true) > connects_before )) ||
  die "the agent did not reconnect within 120 s"
reconnect_s=$(since "$restart_t0"); reconnect_t=$(now)
read -r _ spooled_total < <(spooled_after 0)
drain_rss_max=0
for _ in $(seq 1200); do
  r=$(rss_kib "$agent"); (( r > drain_rss_max )) && drain_rss_max=$r
  (( $(total) >= spooled_total )) && break
  sleep 0.5
done
held=$(total)
(( held >= spooled_total )) || die "the server holds $held of the $spooled_total samples spooled, 600 s after the restart"
drain_s=$(since "$restart_t0"); drain_after_s=$(since "$reconnect_t")
rss_after=$(rss_kib "$agent"); hwm_final=$(hwm_kib "$agent")

# The agent's own count, then the check.
stop "$agent" 150 || die "the agent did not exit cleanly"
counted=$(sed -n 's/.*stopping: \([0-9]*\) samples.*/\1/p' "$work/agent.log" | tail -1)
[[ -n $counted ]] || die "no 'stopping: N samples' line in the agent's log"
! grep -q "stay in the spool" "$work/agent.log" || die "the agent left batches in its spool"
dropped=$(grep -c "dropped the oldest batches" "$work/agent.log" || true)
held=$(total)
stop "$demo" 10 || true
stop "$server" 30 || true

printf '%s\n' "${samples[@]}" | awk -v conn="$rss_connected" -v minutes="$minutes" \
  -v outage_s="$outage_s" -v ob="$outage_batches" -v osmp="$outage_samples" \
  -v reconnect="$reconnect_s" -v drain="$drain_s" -v drain2="$drain_after_s" -v drmax="$drain_rss_max" \
  -v after="$rss_after" -v hwm="$hwm_final" -v held="$held" -v counted="$counted" \
  -v dropped="$dropped" '
  NR == 1 {start = $2; bytes0 = $3; batches0 = $4}
  {if ($2 > max) {max = $2; at = $1}; end = $2; bytes = $3; batches = $4; du = $5; rows = NR}
  END {
    mib = 1024
    printf "\noutage: %d min (%.0f s), %d rows of samples\n", minutes, outage_s, rows
    printf "agent RSS while connected, before the outage (anchor): %.1f MiB\n", conn / mib
    printf "agent RSS in the outage: start %.1f MiB, max %.1f MiB (at %.0f s), end %.1f MiB; max/start %.3f, end/start %.3f\n",
      start / mib, max / mib, at, end / mib, max / start, end / start
    printf "spool at the end of the outage: %d bytes in its files (%.1f KiB; du %d KiB), %d batches spooled in the outage (%d samples), %.0f B per batch (growth over the outage)\n",
      bytes, bytes / 1024, du, ob, osmp, (batches > batches0 ? (bytes - bytes0) / (batches - batches0) : 0)
    printf "after the restart: agent reconnected in %.1f s, spool delivered in %.1f s (%.1f s after the reconnect); agent RSS max %.1f MiB while delivering, %.1f MiB after; VmHWM over the run %.1f MiB\n",
      reconnect, drain, drain2, drmax / mib, after / mib, hwm / mib
    if (dropped > 0) printf "spool dropped batches past --spool-max-bytes: %d warnings\n", dropped
    lost = counted > held ? counted - held : 0; twice = held > counted ? held - counted : 0
    printf "totals: server holds %d of the %d samples the agent counted (lost %d, counted twice %d): %s\n",
      held, counted, lost, twice, (held == counted ? "exact" : "FAILED")
  }'
[[ $held == "$counted" ]] || exit 1
