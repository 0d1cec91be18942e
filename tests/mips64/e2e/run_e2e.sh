#!/usr/bin/env bash
# run_e2e.sh <host bin dir> <mips64 strata-agent> <mips64 workload> <emulator> [tls GEN_CERTS]
#
# MIPS64 end to end on one machine: the x86-64 strata-server (host build) on 127.0.0.1 with an
# ephemeral port; the MIPS64 workload (in-process sampler linked in) and the static MIPS64
# strata-agent, both under qemu user mode (no perf events there: the agent reads the
# workload's in-process ring, --inproc on); then the host CLI's
# `hot-paths --json --service S` must show the workload's hot path
# (... main > run > hot_path > hot_leaf, not truncated) as the top path, with arch mips64el.
#
# With `tls`, certificates are made with GEN_CERTS (deploy/gen-certs.sh): the server runs with
# TLS, client certificates and a tokens file; the agent ships over mutual TLS with the
# certificate of its host, and the CLI reads with a reader token.
#
# Exit 0: pass; 77: skipped (host binaries or emulator missing, printed); else: failure.
# Environment: STRATA_HOST_BIN_DIR overrides <host bin dir>.
set -euo pipefail
host_bin=${STRATA_HOST_BIN_DIR:-$1}
agent=$2; workload=$3; emu=$4; mode=${5:-plain}; gen_certs=${6:-}
service=mips64-hot
for f in "$host_bin/strata-server" "$host_bin/strata"; do
  if [[ ! -x "$f" ]]; then
    echo "SKIP: $f not built (build the x86-64 tree first, or set STRATA_HOST_BIN_DIR)"
    exit 77
  fi
done
if ! command -v "$emu" >/dev/null; then echo "SKIP: $emu not installed"; exit 77; fi
if ! command -v python3 >/dev/null; then echo "SKIP: python3 not installed"; exit 77; fi

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for log in server agent workload; do
    echo "--- $log.log (tail)"; tail -n 30 "$tmp/$log.log" 2>/dev/null || true
  done
  exit 1
}
wait_for() {  # wait_for <seconds> <command...>
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do
    (( SECONDS < deadline )) || return 1
    sleep 0.2
  done
}
start=$SECONDS

server_flags=() agent_flags=() cli_flags=()
if [[ $mode == tls ]]; then
  "$gen_certs" --out "$tmp/pki" --agent mips64-host >/dev/null || fail "gen-certs failed"
  head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/reader.token"
  "$host_bin/strata-server" hash-token --name reader --role reader <"$tmp/reader.token" >"$tmp/auth"
  server_flags=(--tls-cert "$tmp/pki/server.pem" --tls-key "$tmp/pki/server.key"
                --tls-client-ca "$tmp/pki/ca.pem" --auth-file "$tmp/auth")
  agent_flags=(--tls-ca "$tmp/pki/ca.pem" --tls-cert "$tmp/pki/agents/mips64-host.pem"
               --tls-key "$tmp/pki/agents/mips64-host.key" --host mips64-host)
  cli_flags=(--tls-ca "$tmp/pki/ca.pem" --token-file "$tmp/reader.token")
fi
"$host_bin/strata-server" --listen 127.0.0.1:0 --http "" --data "$tmp/data" "${server_flags[@]}" \
  >"$tmp/server.log" 2>&1 &
pids+=($!)
wait_for 30 grep -q "ready on port" "$tmp/server.log" || fail "server did not start"
port=$(sed -n 's/.*ready on port \([0-9]*\).*/\1/p' "$tmp/server.log" | head -n1)
echo "server ready on port $port"

mkdir -p "$tmp/rings"
STRATA_SERVICE=$service STRATA_INPROC_DIR="$tmp/rings" STRATA_INPROC_HZ=250 \
  "$emu" "$workload" 60 >"$tmp/workload.log" 2>&1 &
wpid=$!
pids+=($wpid)
wait_for 30 test -e "$tmp/rings/strata-inproc-$wpid" || fail "workload created no ring"

"$emu" "$agent" --server "127.0.0.1:$port" --pid "$wpid" --inproc on --inproc-dir "$tmp/rings" \
  --spool-dir "$tmp/spool" "${agent_flags[@]}" \
  --interval 1 >"$tmp/agent.log" 2>&1 &
pids+=($!)

# The top path once enough samples arrived: outermost first, must end in the hot path.
check() {
  "$host_bin/strata" --server "127.0.0.1:$port" "${cli_flags[@]}" hot-paths --json \
    --service "$service" \
    >"$tmp/paths.json" 2>"$tmp/cli.err" || return 1
  python3 - "$tmp/paths.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
total = int(r.get("totalSamples", r.get("total_samples", 0)))
paths = r.get("paths", [])
if total < 200 or not paths:
    sys.exit(1)
def names(p): return [f.get("function", "") for f in p.get("frames", [])]
top = paths[0]
hot = sum(int(p.get("samples", 0)) for p in paths
          if names(p)[-4:] == ["main", "run", "hot_path", "hot_leaf"] and not p.get("truncated"))
print("samples %d, archs %s, hot path share %.1f%%, top path: %s%s" % (
    total, r.get("archs"), 100.0 * hot / total, "[truncated] > " if top.get("truncated") else "",
    " > ".join(names(top))))
ok = (r.get("archs") == ["mips64el"] and names(top)[-4:] == ["main", "run", "hot_path", "hot_leaf"]
      and not top.get("truncated") and hot >= 0.6 * total)
sys.exit(0 if ok else 2)
PY
}
deadline=$((SECONDS + 75))
while true; do
  set +e; out=$(check); rc=$?; set -e
  [[ -n "$out" ]] && echo "$out"
  (( rc == 0 )) && break
  if (( SECONDS >= deadline )); then
    cat "$tmp/paths.json" 2>/dev/null | head -c 3000; echo
    fail "the hot path did not show up (rc $rc)"
  fi
  kill -0 "${pids[2]}" 2>/dev/null || fail "agent exited"
  sleep 2
done
if [[ $mode == tls ]]; then
  grep -q "connected to strata-server" "$tmp/agent.log" || fail "the agent never connected"
  grep -q "TLS, authentication required" "$tmp/server.log" || fail "the server was not on TLS"
fi
echo "PASS ($mode) in $((SECONDS - start)) s"
