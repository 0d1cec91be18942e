#!/usr/bin/env bash
# Backbone figures on the demo workload, one scripted run:
#  - samples per second received by the server (strata_ingest_samples_total over the run),
#  - agent CPU % of one core at 99 Hz (/proc/PID/task/*/schedstat summed, ns) over the run,
#  - RocksDB bytes on disk per stored sample after the run (live estimate, and `du` of the
#    data directory after a clean server shutdown).
#
# Usage: tests/bench/backbone/figures.sh [SECONDS=60] [BIN_DIR=build/bin]
set -euo pipefail
seconds=${1:-60}
bin=$(cd "${2:-$(dirname "$0")/../../../build/bin}" && pwd)
work=$(mktemp -d /tmp/strata-figures.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

"$bin/strata-server" --listen 127.0.0.1:0 --http 127.0.0.1:0 --data "$work/data" \
  >"$work/server.log" 2>&1 &
server=$!
for _ in $(seq 1 100); do grep -q "ready on port" "$work/server.log" && break; sleep 0.1; done
port=$(sed -n 's/.*ready on port \([0-9]*\).*/\1/p' "$work/server.log")
# The HTTP port is ephemeral too: find it from the listening sockets of the server.
http_port=$(ss -ltnp 2>/dev/null | awk -v pid="pid=$server," '$0 ~ pid {print $4}' |
  sed 's/.*://' | grep -v "^$port$" | head -1)

STRATA_SERVICE=demo "$bin/demo_service" >"$work/demo.log" 2>&1 &
demo=$!
sleep 0.5
"$bin/strata-agent" --server "127.0.0.1:$port" --pid "$demo" --frequency 99 \
  --spool-dir "$work/spool" \
  >"$work/agent.log" 2>&1 &
agent=$!

metric() { curl -s "http://127.0.0.1:$http_port/metrics" | awk -v m="$1" '$1 == m {print $2}'; }
source "$(dirname "$0")/../cpu_ns.sh"

sleep 5  # let the agent attach and settle
t0=$(date +%s.%N); a0=$(cpu_ns "$agent"); s0=$(metric strata_ingest_samples_total)
sleep "$seconds"
t1=$(date +%s.%N); a1=$(cpu_ns "$agent"); s1=$(metric strata_ingest_samples_total)
live_bytes=$(metric strata_store_bytes)

kill -TERM "$agent"; wait "$agent" || true
kill -TERM "$demo"; wait "$demo" || true
total=$(metric strata_ingest_samples_total)
kill -TERM "$server"; wait "$server" || true
disk=$(du -sb "$work/data" | awk '{print $1}')

awk -v t0="$t0" -v t1="$t1" -v a0="$a0" -v a1="$a1" -v s0="$s0" -v s1="$s1" \
    -v total="$total" -v live="$live_bytes" -v disk="$disk" -v secs="$seconds" 'BEGIN {
  dt = t1 - t0
  printf "run: %d s measured (after 5 s warm-up), demo_service 2 threads, agent at 99 Hz\n", secs
  printf "samples received by the server: %.1f /s (%d in %.1f s)\n", (s1 - s0) / dt, s1 - s0, dt
  printf "agent CPU: %.3f %% of one core\n", 100 * (a1 - a0) / 1e9 / dt
  printf "stored samples: %d\n", total
  printf "RocksDB bytes per sample: %.2f live (WAL + SST estimate, %d B), %.2f on disk after shutdown (%d B)\n",
    live / total, live, disk / total, disk
}'
