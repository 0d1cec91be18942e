#!/usr/bin/env bash
# Production samples to a faster binary, measured: tests/e2e/debuginfo/fdo_work.c is built with
# clang, profiled by the real agent and server, its LLVM sample profile exported (strata export
# --format llvm-sample) and merged, and the workload rebuilt with -fprofile-sample-use. Then
# both binaries run ROUNDS interleaved rounds of SECONDS each (--bench): throughput median of
# each, and their ratio. Also the symbolization cost on the server: the first `top --by line`
# (reads the debug file) against the second (from memory), and per leaf address.
#
#   tests/bench/fdo/fdo.sh [BIN_DIR=build/bin]     env: PROFILE_SECONDS (20), ROUNDS (7),
#                                                   SECONDS_PER_RUN (3), KEEP=1
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
bin=${1:-$root/build/bin}
PROFILE_SECONDS=${PROFILE_SECONDS:-20}
ROUNDS=${ROUNDS:-7}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-3}
src=$root/tests/e2e/debuginfo/fdo_work.c
work=$(mktemp -d /tmp/strata-fdo.XXXXXX)
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; [[ -n ${KEEP:-} ]] || rm -rf "$work"; }
pids=()
trap cleanup EXIT

clang -O2 -g -fdebug-info-for-profiling "$src" -o "$work/base"
"$bin/strata-server" --data "$work/data" --listen 127.0.0.1:0 --http "" >"$work/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do grep -q "ready on port" "$work/server.log" && break; sleep 0.1; done
server=127.0.0.1:$(sed -n 's/.*ready on port \([0-9]*\).*/\1/p' "$work/server.log")
STRATA_SERVICE=fdo "$work/base" >"$work/work.log" 2>&1 &
pids+=($!)
target=$!
"$bin/strata-agent" --server "$server" --pid "$target" --interval 1 >"$work/agent.log" 2>&1 &
agent=$!
sleep "$PROFILE_SECONDS"
kill -TERM "$agent"; wait "$agent" || true
kill "$target"
"$bin/strata" --server "$server" debuginfo upload "$work/base" >/dev/null
t0=$(date +%s%N)
"$bin/strata" --server "$server" top --by line --service fdo --since 1h >/dev/null
t1=$(date +%s%N)
"$bin/strata" --server "$server" top --by line --service fdo --since 1h -n 1000 >"$work/lines.txt"
t2=$(date +%s%N)
rows=$(($(wc -l <"$work/lines.txt") - 2))
echo "symbolization: first top --by line $(( (t1 - t0) / 1000000 )) ms (reads the debug file), second $(( (t2 - t1) / 1000000 )) ms (from memory), $rows lines"
"$bin/strata" --server "$server" export --service fdo --since 1h --format llvm-sample -o "$work/prof.txt"
llvm-profdata merge --sample "$work/prof.txt" -o "$work/prof.afdo"
clang -O2 -g -fdebug-info-for-profiling -fprofile-sample-use="$work/prof.afdo" "$src" -o "$work/fdo"

base=() fdo=()
for r in $(seq "$ROUNDS"); do
  base+=("$("$work/base" --bench "$SECONDS_PER_RUN" | awk '{print $2}')")
  fdo+=("$("$work/fdo" --bench "$SECONDS_PER_RUN" | awk '{print $2}')")
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mb=$(median "${base[@]}") mf=$(median "${fdo[@]}")
echo "throughput ops/s, $ROUNDS interleaved rounds of ${SECONDS_PER_RUN}s:"
echo "  without profile: ${base[*]} (median $mb)"
echo "  with profile:    ${fdo[*]} (median $mf)"
awk -v a="$mb" -v b="$mf" 'BEGIN {printf "FDO speedup (median with / median without): %.3fx\n", b / a}'
