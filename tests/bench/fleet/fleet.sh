#!/usr/bin/env bash
# tests/bench/fleet/fleet.sh [BIN_DIR] [N ...]: the capacity curve of one strata-server.
# For each fleet size N (default 100 1000 5000 10000): a fresh server on an empty data
# directory, strata-loadgen with N agents at 99 Hz x 4 busy threads, 10 s intervals, for
# DURATION seconds (default 60) after a ramp-up of RAMP seconds (default N/100, 10..60);
# prints one line per N and the load generator's exact-totals verdict. Both processes share
# this machine: the server's CPU is measured per process (all its threads).
set -euo pipefail
bin=${1:-build/bin}; shift || true
sizes=("$@"); [[ ${#sizes[@]} -gt 0 ]] || sizes=(100 1000 5000 10000)
duration=${DURATION:-60}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/lib.sh"
work=$(mktemp -d /tmp/strata-fleet-bench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
printf '%7s %10s %10s %9s %8s %10s %8s %7s %9s %9s %9s %9s %10s %6s %s\n' agents samples/s \
  contexts/s cpu% ms/Msmp rss_MiB threads ack_p50 ack_p99 hot_p99 top_p99 flame_p99 B/sample \
  lost verdict
for n in "${sizes[@]}"; do
  ramp=$(( n / 100 )); (( ramp < 10 )) && ramp=10; (( ramp > 60 )) && ramp=60
  data=$work/data-$n
  start_server "$work/server-$n.log" --data "$data" --max-agents $((n + 100))
  out=$("$bin/strata-loadgen" --server "127.0.0.1:$port" --server-pid "$server" --json \
    --agents "$n" --interval 10 --rate 396 --duration $((duration + ramp)) --ramp-up "$ramp" \
    --query-every 5 --drain-timeout 120) || true
  kill -TERM "$server"; wait "$server" || true
  bytes=$(du -sb "$data" | cut -f1)
  python3 - "$out" "$bytes" <<'PY'
import json, sys
r = json.loads(sys.argv[1].strip().splitlines()[-1]); b = int(sys.argv[2])
print(f"{r['agents']:7d} {r['samples_per_s']:10.0f} {r['contexts_per_s']:10.0f} {r['server_cpu_pct']:9.1f} "
      f"{r['server_cpu_ms_per_million_samples']:8.0f} {r['server_peak_rss_mib']:10.0f} {r['server_threads']:8d} "
      f"{r['ack_p50_ms']:7.1f} {r['ack_p99_ms']:9.1f} {r['hot_paths_p99_ms']:9.1f} "
      f"{r['top_p99_ms']:9.1f} {r['flamegraph_p99_ms']:9.1f} "
      f"{b / max(1, r['server_samples']):10.2f} {r['lost'] + r['extra']:6d} {'exact' if r['ok'] else 'FAILED'}")
PY
done
