# Sourced by the fleet benchmarks. start_server LOG [FLAGS...]: strata-server from $bin on an
# ephemeral loopback port, in the background; sets `server` (its PID) and `port` once it is
# ready.
start_server() {
  local log=$1; shift
  "$bin/strata-server" --listen 127.0.0.1:0 --http '' "$@" >"$log" 2>&1 &
  server=$!
  for _ in $(seq 100); do grep -q "ready on port" "$log" && break; sleep 0.1; done
  port=$(sed -n 's/.*ready on port \([0-9]*\).*/\1/p' "$log")
}
