#!/usr/bin/env bash
# tests/bench/cluster/cluster.sh [BIN_DIR]: what a Strata cluster costs and buys, from one run,
# every figure printed next to its anchor. BIN_DIR (default build/bin) holds strata-server,
# strata-loadgen and cluster_fill (built with -DSTRATA_BUILD_BENCHMARKS=ON); etcd is Debian's
# /usr/bin/etcd, one instance for the whole run (each cluster under its own key prefix).
#
# 1. Ingest capacity by node count. strata-loadgen offers AGENTS agents (default 1000) x RATE
#    samples/s (396: 99 Hz x 4 busy threads) in 10 s batches for DURATION s (default 60, plus a
#    ramp-up of AGENTS/100 s, 10..60) to, in turn: one plain strata-server without
#    --cluster-etcd (the anchor), then clusters of 1, 2 and 3 nodes at replication factor
#    min(2, nodes), the agents spread over the nodes (agent i starts on node i mod n and follows
#    the redirect to its host's owners). Per configuration: samples/s delivered, each node's CPU
#    seconds during the load (utime + stime of the whole process, /proc/PID/stat) and CPU ms per
#    million delivered samples, per node and summed over the nodes, the samples/s the
#    configuration would take with one core per node (Msmp/s@1c: 1 s of CPU over the busiest
#    node's ms per sample), ratios to the single server, ack p99 and the loadgen's exact-totals
#    verdict (lost/extra samples; batches still unacknowledged at the end are noted).
#    How to read it: every process shares this machine (2 cores here, the load generator taking
#    its part), so samples/s is capped by the machine, not by the nodes, and stays about flat
#    (at the default load it is simply what is offered). CPU per sample is what carries over to
#    one host per node: the per-node column falling as nodes are added is each node's share of
#    the work, Msmp/s@1c its inverse (the capacity), and the summed column over the single
#    server's is what the cluster costs per sample (at RF 2 every sample is applied on two
#    nodes, plus the forwarding and redirects).
# 2. Replication overhead. 3 nodes at --replication-factor 1, then 2, REP_AGENTS agents
#    (default 300: below saturation, so both deliver the same load) at RATE: CPU ms per million
#    samples (all nodes), samples applied per sample delivered (strata_ingest_samples_total
#    summed over the nodes), bytes forwarded to the other owners per sample
#    (strata_cluster_bytes_replicated_total summed), and bytes on disk per sample (du -sb of
#    every node's data dir after a clean SIGTERM stop). RF 1 is the anchor; RF 2's ratios are
#    the price of a copy of every host on a second node.
# 3. Fan-out query latency. cluster_fill writes DAYS days (default 7) of 10 s windows of HOSTS
#    hosts (12) of one service with STACKS stacks (20000) into the data dirs of nodes n1..n3,
#    each host into the dirs of its 2 owners on the ring, and the same data into one single
#    server's dir. With the nodes and the single server started on them: p50/p99 of ITERATIONS
#    (20) flame graphs (JSON, after one cold run) of the last 1 h and the last 7 d of the data,
#    asked of node n1 (which fans out to all three and merges, each host from one replica) vs
#    the single server (the anchor), and the ratio. The flame graph's total samples must be the
#    same through every node and on the single server.
#
# Exits 1 if samples were lost or counted twice, or the query totals disagree. Single runs on a
# shared machine: compare the ratios, not absolute figures. About 13 minutes with the defaults;
# environment overrides: DURATION AGENTS RATE REP_AGENTS DAYS HOSTS STACKS ITERATIONS, and
# PARTS (default "1 2 3": which of the three to run).
#
#   deploy/bench.sh cluster                                   builds, then runs this
#   DURATION=15 AGENTS=200 DAYS=1 tests/bench/cluster/cluster.sh build/bin    a quick check
set -euo pipefail
bin=${1:-build/bin}
duration=${DURATION:-60}
agents=${AGENTS:-1000}
rate=${RATE:-396}
rep_agents=${REP_AGENTS:-300}
days=${DAYS:-7}
hosts=${HOSTS:-12}
stacks=${STACKS:-20000}
iterations=${ITERATIONS:-20}
for part in ${PARTS:-1 2 3}; do
  [[ $part == [123] ]] || { echo "cluster.sh: PARTS: no part '$part' (1, 2, 3)" >&2; exit 2; }
done
for b in strata-server strata-loadgen cluster_fill; do
  [[ -x $bin/$b ]] || { echo "cluster.sh: no $bin/$b (build with -DSTRATA_BUILD_BENCHMARKS=ON)" >&2; exit 2; }
done
command -v etcd >/dev/null || { echo "cluster.sh: no etcd (Debian package etcd-server)" >&2; exit 2; }
clk=$(getconf CLK_TCK)
work=$(mktemp -d /tmp/strata-cluster-bench.XXXXXX)
pids=()  # every process this script started and has not stopped yet

cleanup() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

# free_ports N: N free loopback ports, none handed out before in this run ($work/ports), from
# below the kernel's range for connections' local ports (common/testing/free_port.h: why).
free_ports() {
  python3 -c 'import random, socket, sys
n, used_file = int(sys.argv[1]), sys.argv[2]
try:
    used = set(open(used_file).read().split())
except OSError:
    used = set()
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
out = []
while len(out) < n:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", random.randrange(10000, low) if low > 11000 else 0))
        port = str(s.getsockname()[1])
    except OSError:
        continue
    finally:
        s.close()
    if port not in used:
        used.add(port)
        out.append(port)
open(used_file, "w").write(" ".join(sorted(used)))
print(" ".join(out))' "$1" "$work/ports"
}

# wait_for LOG PATTERN PID [SECONDS]: until PATTERN is in LOG; fails if PID exits first.
wait_for() {
  local log=$1 pattern=$2 pid=$3 deadline=$((SECONDS + ${4:-60}))
  until grep -q "$pattern" "$log" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "cluster.sh: process $pid exited before '$pattern'; $log:" >&2; tail -20 "$log" >&2; exit 1
    fi
    if (( SECONDS >= deadline )); then
      echo "cluster.sh: no '$pattern' in $log after ${4:-60} s:" >&2; tail -20 "$log" >&2; exit 1
    fi
    sleep 0.1
  done
}

# forget PID...: no longer ours to clean up (exited and waited for).
forget() {
  local keep=() q
  for q in "${pids[@]}"; do [[ " $* " == *" $q "* ]] || keep+=("$q"); done
  pids=("${keep[@]}")
}

# stop PID...: SIGTERM, and wait for a clean exit.
stop() {
  local p
  for p in "$@"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "$@"; do wait "$p" 2>/dev/null || echo "cluster.sh: process $p exited with $?" >&2; done
  forget "$@"
}

# CPU ticks (user + system, all threads) of a process.
ticks() {
  local s f
  s=$(< "/proc/$1/stat")
  read -ra f <<< "${s##*) }"
  echo $(( f[11] + f[12] ))
}

# metric HTTP_PORT NAME: NAME's value summed over its label sets, from the node's /metrics.
metric() {
  curl -sf "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 == n || index($1, n "{") == 1 { s += $2 }
    END { printf "%.0f\n", s }'
}

# start_node NAME DATA [FLAG...]: a strata-server on fresh ports; sets node_pid, node_port,
# node_http once it is ready.
start_node() {
  local name=$1 data=$2 port http
  shift 2
  read -r port http < <(free_ports 2)
  "$bin/strata-server" --listen "127.0.0.1:$port" --http "127.0.0.1:$http" --data "$data" \
    --max-agents $(( agents + rep_agents + 100 )) "$@" > "$work/$name.log" 2>&1 &
  node_pid=$!
  pids+=("$node_pid")
  wait_for "$work/$name.log" "ready on port" "$node_pid"
  node_port=$port node_http=$http
}

# start_cluster TAG N RF DATA_ROOT [FLAG...]: nodes n1..nN under etcd prefix /bench-TAG, each
# ready and seeing all N live; sets c_pids, c_addrs (host:port), c_http, c_dirs.
start_cluster() {
  local tag=$1 n=$2 rf=$3 root=$4 i h deadline
  shift 4
  c_pids=() c_addrs=() c_http=() c_dirs=()
  mkdir -p "$root"
  for i in $(seq 1 "$n"); do
    start_node "$tag-n$i" "$root/n$i" --cluster-etcd "http://127.0.0.1:$etcd_port" \
      --cluster-prefix "/bench-$tag" --node-id "n$i" --replication-factor "$rf" "$@"
    c_pids+=("$node_pid") c_addrs+=("127.0.0.1:$node_port") c_http+=("$node_http")
    c_dirs+=("$root/n$i")
  done
  for h in "${c_http[@]}"; do
    deadline=$((SECONDS + 60))
    until [[ $(metric "$h" 'strata_cluster_nodes{state="live"}') == "$n" ]]; do
      (( SECONDS < deadline )) || { echo "cluster.sh: $tag: a node does not see $n live nodes" >&2; exit 1; }
      sleep 0.2
    done
  done
}

# run_load SERVERS AGENTS LOG: the fleet against SERVERS (comma-separated); sets load_json.
run_load() {
  local ramp=$(( $2 / 100 ))
  (( ramp < 10 )) && ramp=10
  (( ramp > 60 )) && ramp=60
  "$bin/strata-loadgen" --server "$1" --json --agents "$2" --interval 10 --rate "$rate" \
    --duration $(( duration + ramp )) --ramp-up "$ramp" --query-every 0 --drain-timeout 120 \
    > "$work/$3.out" 2> "$work/$3.err" || true
  load_json=$(tail -n1 "$work/$3.out")
  if [[ $load_json != \{* ]]; then
    echo "cluster.sh: strata-loadgen ($3) printed no figures:" >&2; tail -20 "$work/$3.err" >&2; exit 1
  fi
}

# loaded TAG AGENTS PID...: run_load against c_addrs, with each PID's CPU seconds during it in
# cpu_list (comma-separated).
loaded() {
  local tag=$1 n=$2 p i before=() servers
  shift 2
  for p in "$@"; do before+=("$(ticks "$p")"); done
  servers=$(IFS=,; echo "${c_addrs[*]}")
  run_load "$servers" "$n" "$tag"
  cpu_list=
  i=0
  for p in "$@"; do
    cpu_list+="${cpu_list:+,}$(awk -v a="${before[i]}" -v b="$(ticks "$p")" -v c="$clk" \
      'BEGIN { printf "%.2f", (b - a) / c }')"
    i=$((i + 1))
  done
}

cat > "$work/fmt.py" <<'PY'
import json, os, sys
work = os.environ["WORK"]
def fail(what):
    with open(f"{work}/failures", "a") as f: f.write(what + "\n")
def verdict(r, label):
    # Lost or double-counted samples are a bug; batches left unacknowledged at the end (an
    # overloaded configuration) are shown but are not one.
    exact = r["lost"] == 0 and r["extra"] == 0
    if not exact: fail(f"{label}: lost {r['lost']} extra {r['extra']} samples")
    v = f"{'exact' if exact else 'MISMATCH'} {r['lost']}/{r['extra']}"
    late = r["rejected"] + r["unacknowledged"]
    return v if not late else f"{v} ({late} batches unacked)"
def anchor(name, value=None):
    path = f"{work}/anchor-{name}.json"
    if value is not None:
        json.dump(value, open(path, "w"))
    return json.load(open(path))
cmd = sys.argv[1]
if cmd == "capacity":  # label nodes rf load_json cpu_list
    label, nodes, rf, r = sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
    cpu = [float(c) for c in sys.argv[6].split(",")]
    samples = max(1, r["samples"])
    per_node = [1e9 * c / samples for c in cpu]
    total = sum(per_node)
    # With one core per node, the busiest node is the limit: 1 s of CPU / its ms per sample.
    projected = 1e9 / max(1e-9, max(per_node))
    row = {"sps": r["samples_per_s"], "ms": total, "proj": projected}
    a = anchor("capacity", row if label == "single" else None)
    print(f"{label:10s} {nodes:>5s} {rf:>3s} {r['samples_per_s']:10.0f} {row['sps'] / a['sps']:6.2f}x "
          f"{','.join(f'{c:.1f}' for c in cpu):>15s} {','.join(f'{m:.0f}' for m in per_node):>17s} "
          f"{total:8.0f} {total / a['ms']:6.2f}x {projected / 1e6:10.2f} {projected / a['proj']:6.2f}x "
          f"{r['ack_p99_ms']:9.1f}  {verdict(r, label)}")
elif cmd == "replication":  # rf load_json cpu_list applied replicated_bytes replicated_batches disk
    rf, r = sys.argv[2], json.loads(sys.argv[3])
    cpu = sum(float(c) for c in sys.argv[4].split(","))
    applied, rbytes, rbatches, disk = (int(x) for x in sys.argv[5:9])
    samples = max(1, r["server_samples"])
    ms = 1e9 * cpu / max(1, r["samples"])
    row = {"ms": ms, "applied": applied / samples, "repl": rbytes / samples, "disk": disk / samples}
    a = anchor("replication", row if rf == "1" else None)
    ratio = lambda k: f"{row[k] / a[k]:6.2f}x" if a[k] else "     -"
    print(f"{rf:>3s} {r['samples_per_s']:10.0f} {ms:9.0f} {ratio('ms')} {row['applied']:11.2f} "
          f"{row['repl']:10.2f} {rbatches:10d} {row['disk']:10.2f} {ratio('disk')}  "
          f"{verdict(r, f'RF {rf}')}")
elif cmd == "fill":  # cluster_json single_json
    c, s = json.loads(sys.argv[2]), json.loads(sys.argv[3])
    print(f"fill: {c['hosts']} hosts x {c['windows']} windows x {c['cells'] // (c['hosts'] * c['windows'])} "
          f"cells, {c['stacks']} stacks, {c['samples']} samples ({c['fill_s']:.0f} s for the nodes' dirs, "
          f"{s['fill_s']:.0f} s for the single one, in parallel)")
    for d in c["dirs"] + s["dirs"]:
        print(f"  {d['node']:6s} {d['hosts']:3d} hosts {d['samples']:12d} samples {d['bytes'] / 2**20:8.1f} MiB")
elif cmd == "query":  # range cluster_json single_json other_node_totals
    rng, c, s = sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
    others = [int(t) for t in sys.argv[5].split(",") if t]
    agree = c["total_samples"] == s["total_samples"] and all(t == s["total_samples"] for t in others)
    if not agree: fail(f"{rng}: totals n1 {c['total_samples']}, other nodes {others}, single {s['total_samples']}")
    print(f"{rng:5s} {c['cold_ms']:8.1f} {c['p50_ms']:8.1f} {c['p99_ms']:8.1f} {s['cold_ms']:8.1f} "
          f"{s['p50_ms']:8.1f} {s['p99_ms']:8.1f} {c['p50_ms'] / s['p50_ms']:6.2f}x "
          f"{c['p99_ms'] / s['p99_ms']:6.2f}x {s['total_samples']:12d} {c['bytes'] / 1024:8.0f} "
          f"{'agree' if agree else 'DIFFER'}")
PY
export WORK=$work
fmt() { python3 "$work/fmt.py" "$@"; }

# etcd, for every cluster of the run.
read -r etcd_port etcd_peer < <(free_ports 2)
etcd --name bench --data-dir "$work/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
  --initial-cluster "bench=http://127.0.0.1:$etcd_peer" > "$work/etcd.log" 2>&1 &
etcd_pid=$!
pids+=("$etcd_pid")
wait_for "$work/etcd.log" "ready to serve client requests" "$etcd_pid"

capacity() {
  echo "== 1. Ingest capacity: $agents agents x $rate samples/s offered in 10 s batches, $duration s" \
    "(+ramp-up); CPU of each node process during the load ($(nproc) cores shared with the load generator)"
  printf '%-10s %5s %3s %10s %7s %15s %17s %8s %7s %10s %7s %9s  %s\n' config nodes RF \
    samples/s "vs 1" "cpu_s per node" "ms/Msmp per node" ms/Msmp "vs 1" Msmp/s@1c "vs 1" \
    ack_p99ms "lost/extra samples"
  start_node single "$work/cap-single"
  c_addrs=("127.0.0.1:$node_port")
  loaded cap-single "$agents" "$node_pid"
  stop "$node_pid"
  fmt capacity single 1 - "$load_json" "$cpu_list"
  for n in 1 2 3; do
    rf=$(( n < 2 ? n : 2 ))
    start_cluster "cap$n" "$n" "$rf" "$work/cap$n"
    loaded "cap$n" "$agents" "${c_pids[@]}"
    stop "${c_pids[@]}"
    fmt capacity "cluster-$n" "$n" "$rf" "$load_json" "$cpu_list"
  done
  rm -rf "$work"/cap*
  echo
}

replication() {
  echo "== 2. Replication overhead: 3 nodes, $rep_agents agents x $rate samples/s, $duration s;" \
    "RF 1 is the anchor"
  printf '%3s %10s %9s %7s %11s %10s %10s %10s %7s  %s\n' RF samples/s ms/Msmp "vs RF1" \
    applied/smp repl_B/smp repl_batch disk_B/smp "vs RF1" "lost/extra samples"
  for rf in 1 2; do
    start_cluster "rep$rf" 3 "$rf" "$work/rep$rf"
    loaded "rep$rf" "$rep_agents" "${c_pids[@]}"
    applied=0 rbytes=0 rbatches=0
    for h in "${c_http[@]}"; do
      applied=$(( applied + $(metric "$h" strata_ingest_samples_total) ))
      rbytes=$(( rbytes + $(metric "$h" strata_cluster_bytes_replicated_total) ))
      rbatches=$(( rbatches + $(metric "$h" strata_cluster_batches_replicated_total) ))
    done
    stop "${c_pids[@]}"
    disk=$(du -sbc "${c_dirs[@]}" | tail -n1 | cut -f1)
    fmt replication "$rf" "$load_json" "$cpu_list" "$applied" "$rbytes" "$rbatches" "$disk"
    rm -rf "$work/rep$rf"
  done
  echo
}

fanout_queries() {
  echo "== 3. Fan-out query latency: flame graphs (JSON) over $days days of $hosts hosts, 3 nodes" \
    "at RF 2 (asked through n1) vs one server with the same data (the anchor)"
  end_ms=$(( $(date +%s%3N) / 10000 * 10000 ))
  fill_flags=(--days "$days" --hosts "$hosts" --stacks "$stacks" --end-ms "$end_ms")
  "$bin/cluster_fill" "${fill_flags[@]}" --out "$work/q/n1,$work/q/n2,$work/q/n3" \
    --nodes n1,n2,n3 --replication-factor 2 > "$work/fill-cluster.json" 2> "$work/fill-cluster.err" &
  fill_cluster=$!
  pids+=("$fill_cluster")
  "$bin/cluster_fill" "${fill_flags[@]}" --out "$work/q/single" --nodes single \
    > "$work/fill-single.json" 2> "$work/fill-single.err" &
  fill_single=$!
  pids+=("$fill_single")
  for f in cluster single; do
    p=$([[ $f == cluster ]] && echo "$fill_cluster" || echo "$fill_single")
    wait "$p" || { echo "cluster.sh: cluster_fill ($f) failed:" >&2; cat "$work/fill-$f.err" >&2; exit 1; }
    forget "$p"
  done
  fmt fill "$(< "$work/fill-cluster.json")" "$(< "$work/fill-single.json")"
  # No retention: the oldest windows are a week old by the time they are queried.
  keep=(--retention-raw 0 --retention-minute 0 --retention-hour 0)
  start_cluster q 3 2 "$work/q" "${keep[@]}"
  start_node q-single "$work/q/single" "${keep[@]}"
  single_addr=127.0.0.1:$node_port
  printf '%-5s %8s %8s %8s %8s %8s %8s %7s %7s %12s %8s %s\n' range n1_cold n1_p50 n1_p99 \
    one_cold one_p50 one_p99 "p50 x" "p99 x" samples JSON_KiB totals
  for r in 1h:3600000 7d:604800000; do
    from=$(( end_ms - ${r#*:} ))
    q=(--service cluster-bench --from-ms "$from" --to-ms "$end_ms")
    cluster_json=$("$bin/cluster_fill" --query "${c_addrs[0]}" "${q[@]}" --iterations "$iterations")
    single_json=$("$bin/cluster_fill" --query "$single_addr" "${q[@]}" --iterations "$iterations")
    others=
    for a in "${c_addrs[@]:1}"; do
      t=$("$bin/cluster_fill" --query "$a" "${q[@]}" --iterations 0 | python3 -c \
        'import json, sys; print(json.load(sys.stdin)["total_samples"])')
      others+="${others:+,}$t"
    done
    fmt query "${r%%:*}" "$cluster_json" "$single_json" "$others"
  done
  echo "(ms; 'one' is the single server, 'x' n1 over it; samples: the graph's total, the same through" \
    "n1, n2, n3 and on the single server; JSON_KiB: the rendered graph n1 returned)"
}

for part in ${PARTS:-1 2 3}; do
  case $part in
    1) capacity ;;
    2) replication ;;
    3) fanout_queries ;;
  esac
done

if [[ -s $work/failures ]]; then
  echo
  echo "FAILED:"
  cat "$work/failures"
  exit 1
fi
