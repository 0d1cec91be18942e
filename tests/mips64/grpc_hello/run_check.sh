#!/usr/bin/env bash
# run_check.sh <host hello_server> <client> [emulator]: starts the host server, runs the
# (cross-built) client against it, prints the elapsed time. Exit 0 when the call succeeded.
set -euo pipefail
server=$1; client=$2; emu=${3:-}
tmp=$(mktemp -d); trap 'kill "$spid" 2>/dev/null || true; rm -rf "$tmp"' EXIT
"$server" --port_file "$tmp/port" --max_calls 1 --timeout_s 60 >"$tmp/server.log" 2>&1 &
spid=$!
for _ in $(seq 200); do [[ -f "$tmp/port" ]] && break; sleep 0.05; done
port=$(cat "$tmp/port")
start=$(date +%s.%N)
# shellcheck disable=SC2086
timeout 60 $emu "$client" "$port"
end=$(date +%s.%N)
wait "$spid"
echo "client round trip: $(echo "$end - $start" | bc) s"
