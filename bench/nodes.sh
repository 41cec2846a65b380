#!/usr/bin/env bash
# node_transport against tcp_transport on two "hosts" of this machine: two network namespaces
# joined by a veth pair, each with a hostname of its own (a UTS namespace), two ranks on each.
# Runs chorus_bench over both transports in one go, interleaved (tcp, node, tcp, node), and
# prints the rows; the ratio of busbw is the figure (never an absolute time: one machine's cores
# carry both "hosts").
#
# Usage: bench/nodes.sh [BUILD_DIR] [CHORUS_BENCH ARGS...]   (as root; default build-rel)
#   e.g. bench/nodes.sh build-rel -b 8 -e 64M -f 8 --ops allreduce
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
done

export CHORUS_JOB_TOKEN=nodes-bench-$id
one() {  # TRANSPORT: one job, 2 hosts x 2 ranks; rank 0's rows on stdout
    local pids=() i
    for i in 0 1; do
        ip netns exec "$(ns "$i")" unshare --uts sh -c 'echo "$0" >/proc/sys/kernel/hostname && exec "$@"' "bench-host$i" \
            "$run" --nnodes 2 --node-rank "$i" -n 2 --master-addr 192.0.2.10 --master-port 29511 \
            "$bench" --transport "$1" "${args[@]}" >"/tmp/nodes-bench-$id.$i" 2>&1 &
        pids+=($!)
    done
    wait "${pids[@]}"
    grep -v '^\[rank[1-3]\]' "/tmp/nodes-bench-$id.0" | sed 's/^\[rank0\] //'
    rm -f /tmp/nodes-bench-$id.*
}
echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(nproc) cpus, chorus $(git -C "$root" rev-parse --short HEAD 2>/dev/null)"
for round in $(seq "${ROUNDS:-2}"); do
    echo "# round $round: tcp_transport"
    one tcp
    echo "# round $round: node_transport"
    one node
done
