#!/usr/bin/env bash
# tests/bench/fleet/tls.sh [BIN_DIR] [AGENTS]: what TLS costs the server, plaintext and TLS side
# by side in one run. For each mode: a fresh server (TLS: certificates from
# deploy/gen-certs.sh, client certificates requested, a tokens file; the simulated agents
# authenticate with an agent token), strata-loadgen with AGENTS agents (default 1000) at
# 99 Hz x 4 busy threads, 10 s intervals, DURATION seconds (default 60) after a 10 s ramp-up;
# then PROBES (default 200) fresh connections one after another, timed to ready (the TCP and,
# with TLS, the TLS handshake: what an agent's reconnect costs before its first message).
# Prints the server's CPU per million samples and the connection times, and TLS / plaintext.
set -euo pipefail
bin=${1:-build/bin}
agents=${2:-1000}
duration=${DURATION:-60}
probes=${PROBES:-200}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/lib.sh"
work=$(mktemp -d /tmp/strata-tls-bench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
"$here/../../../deploy/gen-certs.sh" --out "$work/pki" >/dev/null
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/agent.token"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/reader.token"
{
  "$bin/strata-server" hash-token --name fleet --role agent <"$work/agent.token"
  "$bin/strata-server" hash-token --name bench --role reader <"$work/reader.token"
} >"$work/auth"

printf '%-9s %8s %10s %9s %9s %10s %12s %12s %s\n' mode agents samples/s cpu% ms/Msmp rss_MiB \
  connect_p50 connect_p99 verdict
for mode in plaintext tls; do
  server_flags=() client_flags=()
  if [[ $mode == tls ]]; then
    server_flags=(--tls-cert "$work/pki/server.pem" --tls-key "$work/pki/server.key"
                  --tls-client-ca "$work/pki/ca.pem" --auth-file "$work/auth"
                  --max-streams-per-principal $((agents + 100)))
    client_flags=(--tls-ca "$work/pki/ca.pem" --token-file "$work/agent.token"
                  --query-token-file "$work/reader.token")
  fi
  start_server "$work/server-$mode.log" --data "$work/data-$mode" \
    --max-agents $((agents + 100)) "${server_flags[@]}"
  out=$("$bin/strata-loadgen" --server "127.0.0.1:$port" --server-pid "$server" --json \
    "${client_flags[@]}" --agents "$agents" --interval 10 --rate 396 \
    --duration $((duration + 10)) --ramp-up 10 --query-every 5 --drain-timeout 120) || true
  probe=$("$bin/strata-loadgen" --server "127.0.0.1:$port" "${client_flags[@]}" \
    --connect-probes "$probes")
  kill -TERM "$server"; wait "$server" || true
  python3 - "$mode" "$out" "$probe" <<'PY'
import json, sys
mode, out, probe = sys.argv[1], sys.argv[2], sys.argv[3]
r = json.loads(out.strip().splitlines()[-1]); p = json.loads(probe.strip().splitlines()[-1])
print(f"{mode:<9} {r['agents']:8d} {r['samples_per_s']:10.0f} {r['server_cpu_pct']:9.1f} "
      f"{r['server_cpu_ms_per_million_samples']:9.0f} {r['server_peak_rss_mib']:10.0f} "
      f"{p['connect_p50_ms']:10.2f}ms {p['connect_p99_ms']:10.2f}ms {'exact' if r['ok'] else 'FAILED'}")
PY
  echo "$out" | tail -n1 >"$work/fleet-$mode.json"
  echo "$probe" | tail -n1 >"$work/probe-$mode.json"
done
python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
f = {m: json.load(open(f"{w}/fleet-{m}.json")) for m in ("plaintext", "tls")}
p = {m: json.load(open(f"{w}/probe-{m}.json")) for m in ("plaintext", "tls")}
cpu = f["tls"]["server_cpu_ms_per_million_samples"] / f["plaintext"]["server_cpu_ms_per_million_samples"]
con = p["tls"]["connect_p50_ms"] / p["plaintext"]["connect_p50_ms"]
print(f"TLS / plaintext: server CPU per sample {cpu:.2f}x; connection ready (p50) {con:.1f}x "
      f"({p['tls']['connect_p50_ms'] - p['plaintext']['connect_p50_ms']:.2f} ms of TLS handshake)")
PY
