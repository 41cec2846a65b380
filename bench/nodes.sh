#!/usr/bin/env bash
# node_transport against tcp_transport on two "hosts" of this machine: two network namespaces
# joined by a veth pair, each with a hostname of its own (a UTS namespace), two ranks on each.
# Runs chorus_bench over both transports in one go, interleaved (tcp, node, tcp, node), and
# prints the rows; the ratio of busbw is the figure (never an absolute time: one machine's cores
# carry both "hosts").
#
# Usage: bench/nodes.sh [BUILD_DIR] [CHORUS_BENCH ARGS...]   (as root; default build-rel)
#   e.g. bench/nodes.sh build-rel -b 8 -e 64M -f 8 --ops allreduce
# Environment:
#   LINK_RATE=2gbit   the link between the hosts carries at most this (a tbf qdisc on both ends
#                     of the veth; default: unlimited, i.e. a memory copy on the same cores)
#   PLACEMENT=cyclic  rank r on host r % 2 (Slurm's --distribution=cyclic) instead of block
#                     placement (ranks 0, 1 on the first host)
#   ROUNDS=2          how many times each transport runs, interleaved
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$root/build-rel}
shift || true
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-b 8 -e 64M -f 8 --ops allreduce)
[ "$(id -u)" = 0 ] || { echo "nodes.sh: needs root (network namespaces)" >&2; exit 1; }
run=$build/chorusrun bench=$build/bench/chorus_bench
[ -x "$run" ] && [ -x "$bench" ] || { echo "nodes.sh: build chorusrun and chorus_bench in $build first" >&2; exit 1; }

id=$$
ns() { echo "chorus-bench-$id-h$1"; }
cleanup() { for i in 0 1; do ip netns pids "$(ns "$i")" 2>/dev/null | xargs -r kill -KILL; ip netns del "$(ns "$i")" 2>/dev/null; done; }
trap cleanup EXIT
for i in 0 1; do
    ip netns add "$(ns "$i")"
    ip -n "$(ns "$i")" link set lo up
done
ip link add "cb$id-0" netns "$(ns 0)" type veth peer name "cb$id-1" netns "$(ns 1)"
for i in 0 1; do
    ip -n "$(ns "$i")" link set "cb$id-$i" name eth0
    ip -n "$(ns "$i")" addr add "192.0.2.$((10 + i))/24" dev eth0
    ip -n "$(ns "$i")" link set eth0 up
    # A token bucket: LINK_RATE on average, bursts of 1 ms of it, queueing at most 20 ms.
    [ -z "${LINK_RATE:-}" ] || ip netns exec "$(ns "$i")" tc qdisc add dev eth0 root tbf rate "$LINK_RATE" burst 256kb latency 20ms
done

export CHORUS_JOB_TOKEN=nodes-bench-$id
# chorusrun numbers ranks by block (host i: ranks 2i, 2i+1); cyclic placement renumbers them
# before the benchmark starts: host i gets ranks i and i + 2 (rank 0 stays on the master's host,
# where chorusrun hands it the rendezvous socket).
case ${PLACEMENT:-block} in
    block) renumber='exec "$@"' ;;
    cyclic) renumber='RANK=$((LOCAL_RANK * 2 + GROUP_RANK)) exec "$@"' ;;
    *) echo "nodes.sh: PLACEMENT is block or cyclic" >&2; exit 1 ;;
esac
one() {  # TRANSPORT: one job, 2 hosts x 2 ranks; rank 0's rows on stdout
    local pids=() i
    for i in 0 1; do
        ip netns exec "$(ns "$i")" unshare --uts sh -c 'echo "$0" >/proc/sys/kernel/hostname && exec "$@"' "bench-host$i" \
            "$run" --nnodes 2 --node-rank "$i" -n 2 --master-addr 192.0.2.10 --master-port 29511 \
            sh -c "$renumber" sh "$bench" --transport "$1" "${args[@]}" >"/tmp/nodes-bench-$id.$i" 2>&1 &
        pids+=($!)
    done
    wait "${pids[@]}"
    grep -v '^\[rank[1-3]\]' "/tmp/nodes-bench-$id.0" | sed 's/^\[rank0\] //'
    rm -f /tmp/nodes-bench-$id.*
}
echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(nproc) cpus, chorus $(git -C "$root" rev-parse --short HEAD 2>/dev/null)," \
    "link ${LINK_RATE:-unlimited}, ${PLACEMENT:-block} placement"
for round in $(seq "${ROUNDS:-2}"); do
    echo "# round $round: tcp_transport"
    one tcp
    echo "# round $round: node_transport"
    one node
done
