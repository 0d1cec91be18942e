#!/usr/bin/env bash
# tests/bench/fleet/otlp.sh [BIN_DIR] [AGENTS]: what OTLP ingest costs against Strata's own
# protocol, on the same samples. For each protocol: a fresh server on an empty data directory,
# strata-loadgen --protocol P with AGENTS agents (default 1000) at 99 Hz x 4 busy threads, 10 s
# intervals, DURATION seconds (default 60) after a RAMP-second ramp-up (default 10). Strata's
# agents keep one stream each and send their call graph once; OTLP's send one self-contained
# Export request per interval (dictionary, stacks, samples), as the OpenTelemetry eBPF
# profiler does. Prints the server's CPU per million samples, the bytes sent per sample
# (serialized messages) and stored per sample, and OTLP / Strata.
set -euo pipefail
bin=${1:-build/bin}
agents=${2:-1000}
duration=${DURATION:-60}
ramp=${RAMP:-10}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/lib.sh"
work=$(mktemp -d /tmp/strata-otlp-bench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

printf '%-8s %7s %10s %7s %9s %10s %10s %9s %s\n' protocol agents samples/s cpu% ms/Msmp \
  wire_B/smp store_B/smp ack_p99 verdict
for protocol in strata otlp; do
  data=$work/data-$protocol
  start_server "$work/server-$protocol.log" --data "$data" --max-agents $((agents + 100))
  "$bin/strata-loadgen" --server "127.0.0.1:$port" --server-pid "$server" --json \
    --protocol "$protocol" --agents "$agents" --interval 10 --rate 396 \
    --duration $((duration + ramp)) --ramp-up "$ramp" --query-every 0 --drain-timeout 120 \
    >"$work/$protocol.out" || true
  kill -TERM "$server"; wait "$server" || true
  tail -n1 "$work/$protocol.out" >"$work/$protocol.json"
  du -sb "$data" | cut -f1 >"$work/$protocol.bytes"
done
python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
r = {p: json.load(open(f"{w}/{p}.json")) for p in ("strata", "otlp")}
stored = {p: int(open(f"{w}/{p}.bytes").read()) / max(1, r[p]["server_samples"]) for p in r}
for p, x in r.items():
    print(f"{p:<8} {x['agents']:7d} {x['samples_per_s']:10.0f} {x['server_cpu_pct']:7.1f} "
          f"{x['server_cpu_ms_per_million_samples']:9.0f} {x['bytes_per_sample']:10.2f} "
          f"{stored[p]:10.2f} {x['ack_p99_ms']:8.1f}ms {'exact' if x['ok'] else 'FAILED'}")
s, o = r["strata"], r["otlp"]
print(f"OTLP / Strata: server CPU per sample {o['server_cpu_ms_per_million_samples'] / s['server_cpu_ms_per_million_samples']:.2f}x, "
      f"bytes sent per sample {o['bytes_per_sample'] / s['bytes_per_sample']:.2f}x, "
      f"bytes stored per sample {stored['otlp'] / stored['strata']:.2f}x")
PY
