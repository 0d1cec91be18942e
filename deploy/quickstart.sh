#!/usr/bin/env bash
# deploy/quickstart.sh: from a fresh clone to hot paths in one command.
#
# Installs dependencies, builds, starts strata-server on an embedded RocksDB directory
# (./var/strata), starts the demo workload and strata-agent on it, waits, and prints the
# demo's hot paths and top functions. Everything keeps running afterwards; the script says
# how to stop it.
#
# Environment: STRATA_DATA (default ./var/strata), STRATA_PORT (7070), STRATA_HTTP_PORT (7071),
# WAIT_SECONDS (20), BUILD_DIR (build).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
build=${BUILD_DIR:-build}
data=${STRATA_DATA:-$root/var/strata}
port=${STRATA_PORT:-7070}
http_port=${STRATA_HTTP_PORT:-7071}
wait_s=${WAIT_SECONDS:-20}
run=$root/var/run
mkdir -p "$data" "$run"

"$root/deploy/install-deps.sh"
echo "== building (first build takes a few minutes)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_BUILD_TESTS=ON \
  -DSTRATA_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target strata-server strata-agent strata demo_service
bin=$root/$build/bin

stop_old() {
  local f=$run/$1.pid
  if [[ -f $f ]] && kill -0 "$(cat "$f")" 2>/dev/null; then
    kill "$(cat "$f")" 2>/dev/null || true
    sleep 1
  fi
}
stop_old agent; stop_old demo; stop_old server

echo "== starting strata-server on 127.0.0.1:$port (data in $data, HTTP on 127.0.0.1:$http_port)"
nohup "$bin/strata-server" --listen "127.0.0.1:$port" --http "127.0.0.1:$http_port" \
  --data "$data" >"$run/server.log" 2>&1 &
echo $! >"$run/server.pid"
for _ in $(seq 1 50); do
  grep -q "ready on port" "$run/server.log" 2>/dev/null && break
  sleep 0.2
done
grep -q "ready on port" "$run/server.log" || { cat "$run/server.log"; exit 1; }

echo "== starting the demo workload and strata-agent"
# Debian ships libstdc++ stripped; libstdc++6-12-dbg (installed above) holds the same library
# unstripped beside it, so the demo's threads are named down to their libstdc++ root
# (execute_native_thread_routine) instead of a raw offset.
demo_env=(STRATA_SERVICE=demo)
debug_libs=/usr/lib/$(gcc -dumpmachine)/debug
if [[ -e $debug_libs/libstdc++.so.6 ]]; then demo_env+=("LD_LIBRARY_PATH=$debug_libs"); fi
env "${demo_env[@]}" nohup "$bin/demo_service" >"$run/demo.log" 2>&1 &
echo $! >"$run/demo.pid"
sleep 0.5
nohup "$bin/strata-agent" --server "127.0.0.1:$port" --pid "$(cat "$run/demo.pid")" \
  --interval 5 --spool-dir "$run/spool" >"$run/agent.log" 2>&1 &
echo $! >"$run/agent.pid"

echo "== profiling for $wait_s s"
sleep "$wait_s"

export STRATA_SERVER=127.0.0.1:$port
echo
"$bin/strata" hot-paths --service demo --since 5m --limit 5
echo
"$bin/strata" top --service demo --since 5m --limit 10
cat <<MSG

Strata keeps running: server (pid $(cat "$run/server.pid")), demo (pid $(cat "$run/demo.pid")),
agent (pid $(cat "$run/agent.pid")); logs in $run.
  Query again:   STRATA_SERVER=127.0.0.1:$port $bin/strata hot-paths --service demo
  Metrics:       curl -s http://127.0.0.1:$http_port/metrics
  Stop all:      kill \$(cat $run/agent.pid $run/demo.pid $run/server.pid)
Data stays in $data; starting the server again on it keeps every acknowledged sample.
MSG
