#!/usr/bin/env bash
# Multi-host tests on one machine: every rank in its own network namespace ("host"), the
# namespaces joined by veth links to a bridge in one more namespace, addresses from
# 192.0.2.0/24 and fd00::/8 (documentation / unique-local ranges, visible only inside these
# namespaces). Each host runs `chorusrun --nnodes 4 --node-rank i -n 1`, MASTER_ADDR is host 0's
# address. Checks: the seed's examples, a randomized allreduce/alltoallv stress run over IPv4
# (the mesh on a second network chosen with CHORUS_SOCKET_IFNAME=eth1) and IPv6, the full collective matrix,
# the stress run again with 5% of incoming TCP packets dropped by nftables on every host, an
# outage that holds handshakes up past the gates' grace during set-up (the ranks connect again),
# and a host blackholed by nftables in the middle of a job (the others must name it and exit).
#
# Usage: netns.sh CHORUSRUN PROCESS_CHECK [EXAMPLE...]
# Needs root, iproute2 and nftables; exits 77 (ctest: skipped) with the reason otherwise.
set -uo pipefail
run=$1 check=$2
shift 2
examples=("$@")
hosts=4

skip() {
    echo "SKIPPED: $*"
    exit 77
}
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces"
command -v ip >/dev/null || skip "needs iproute2 (ip)"
command -v nft >/dev/null || skip "needs nftables (nft)"

id=$$
bridge_ns=chorus-$id-br
ns() { echo "chorus-$id-h$1"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/chorus-netns.XXXXXX")
cleanup() {
    for i in $(seq 0 $((hosts - 1))); do ip netns pids "$(ns "$i")" 2>/dev/null | xargs -r kill -KILL 2>/dev/null; done
    for i in $(seq 0 $((hosts - 1))); do ip netns del "$(ns "$i")" 2>/dev/null; done
    ip netns del "$bridge_ns" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

ip netns add "$bridge_ns" 2>"$tmp/err" || skip "cannot create a network namespace: $(cat "$tmp/err")"
ip -n "$bridge_ns" link add br0 type bridge || exit 1
ip -n "$bridge_ns" link add br1 type bridge || exit 1
ip -n "$bridge_ns" link set br0 up
ip -n "$bridge_ns" link set br1 up
ip -n "$bridge_ns" link set lo up
for i in $(seq 0 $((hosts - 1))); do
    n=$(ns "$i")
    ip netns add "$n" || exit 1
    # Created in the bridge namespace, so the temporary names cannot clash with other jobs.
    ip -n "$bridge_ns" link add "b$i" type veth peer name eth0 netns "$n" || exit 1
    ip -n "$bridge_ns" link set "b$i" master br0 up
    ip -n "$n" link set lo up
    ip -n "$n" addr add "192.0.2.$((10 + i))/24" dev eth0
    ip -n "$n" addr add "fd00::$((10 + i))/64" dev eth0 nodad
    ip -n "$n" link set eth0 up
    # A second network (eth1, 198.51.100.0/24) for the CHORUS_SOCKET_IFNAME check.
    ip -n "$bridge_ns" link add "c$i" type veth peer name eth1 netns "$n" || exit 1
    ip -n "$bridge_ns" link set "c$i" master br1 up
    ip -n "$n" addr add "198.51.100.$((10 + i))/24" dev eth1
    ip -n "$n" link set eth1 up
done
# No wait for links or neighbours: the rendezvous retries with back-off until its deadline.

export CHORUS_JOB_TOKEN=netns-test-$id-$RANDOM
failures=0
# job NAME MASTER_ADDR [ENV=VALUE...] -- PROGRAM ARGS...: one rank per host (or job_ranks ranks
# on each of the first job_hosts hosts, each with a hostname of its own in a UTS namespace);
# all must pass.
job() {
    local name=$1 master=$2
    shift 2
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    local start end pids=() rc i bad=0 nh=${job_hosts:-$hosts} wrap=()
    start=$(date +%s%3N)
    for i in $(seq 0 $((nh - 1))); do
        [ -n "${job_ranks:-}" ] && wrap=(unshare --uts sh -c 'echo "$0" >/proc/sys/kernel/hostname && exec "$@"' "chorus-host$i")
        ip netns exec "$(ns "$i")" "${wrap[@]}" env "${envs[@]}" "$run" --nnodes "$nh" --node-rank "$i" -n "${job_ranks:-1}" \
            --master-addr "$master" --master-port 29500 --timeout-ms 60000 "$@" >"$tmp/$name.$i.out" 2>"$tmp/$name.$i.err" &
        pids+=($!)
    done
    for i in $(seq 0 $((nh - 1))); do
        wait "${pids[$i]}"
        rc=$?
        if [ "$rc" -ne 0 ]; then
            bad=1
            echo "--- $name: host $i exited $rc"
            cat "$tmp/$name.$i.out" "$tmp/$name.$i.err"
        fi
    done
    end=$(date +%s%3N)
    if [ "$bad" -ne 0 ]; then
        echo "FAIL: $name"
        failures=$((failures + 1))
    else
        echo "ok: $name ($((end - start)) ms)"
        [ -n "${show:-}" ] && cat "$tmp/$name".*.out
    fi
    return 0
}

# count_tcp_in HOST TABLE IFACE: host HOST counts the TCP packets it receives on IFACE, in an
# nftables table of that name; packets HOST TABLE: the count of such a table.
count_tcp_in() {
    ip netns exec "$(ns "$1")" nft -f - <<EOF || { echo "FAIL: nft"; exit 1; }
table inet $2 {
    chain input {
        type filter hook input priority 0; policy accept;
        iifname "$3" meta l4proto tcp counter
    }
}
EOF
}
packets() { ip netns exec "$(ns "$1")" nft list table inet "$2" | sed -n 's/.*counter packets \([0-9]*\).*/\1/p'; }

for e in "${examples[@]}"; do
    show=1 job "example-$(basename "$e")" 192.0.2.10 -- "$e"
done
# The rendezvous goes to host 0 over eth0, but every rank advertises its eth1 address, so
# the mesh (all the data) must cross the second network: host 0 counts TCP packets on eth1.
count_tcp_in 0 chorus_ifname eth1
job stress-ipv4-ifname-eth1 192.0.2.10 CHORUS_SOCKET_IFNAME=eth1 -- "$check" stress 2024 30
eth1=$(packets 0 chorus_ifname)
echo "host 0 received ${eth1:-0} TCP packets on eth1 (the CHORUS_SOCKET_IFNAME network)"
[ "${eth1:-0}" -gt 100 ] || { echo "FAIL: the mesh did not use eth1"; failures=$((failures + 1)); }
job stress-ipv6 fd00::10 -- "$check" stress 2025 30
job matrix-ipv6 "[fd00::10]" -- "$check" matrix

# 5% loss on every host's incoming TCP packets: TCP retransmits, results stay exact.
for i in $(seq 0 $((hosts - 1))); do
    ip netns exec "$(ns "$i")" nft -f - <<'EOF' || { echo "FAIL: nft"; exit 1; }
table inet chorus_loss {
    chain input {
        type filter hook input priority 0; policy accept;
        meta l4proto tcp numgen random mod 100 < 5 counter drop
    }
}
EOF
done
job stress-ipv4-5pct-loss 192.0.2.10 -- "$check" stress 2026 40
dropped=0
for i in $(seq 0 $((hosts - 1))); do
    d=$(packets "$i" chorus_loss)
    dropped=$((dropped + ${d:-0}))
done
echo "nftables dropped $dropped TCP packets during the lossy run"
[ "$dropped" -gt 0 ] || { echo "FAIL: the drop rule dropped nothing"; failures=$((failures + 1)); }

for i in $(seq 0 $((hosts - 1))); do ip netns exec "$(ns "$i")" nft delete table inet chorus_loss; done

# An outage during set-up: host 0 drops what host 1 sends it and host 1 what host 2 sends it,
# except segments without data (SYN, ACK: ip length <= 60), so the connections open but their
# handshakes are held up until each acceptor's gate gives up on them (its 5 s grace). The
# ranks must connect again and the job pass: rank 1's hello to the master, then rank 2's
# mesh connection to rank 1, twice. Each drop is lifted once that gate said it refused the
# hello, or both mesh connections, so the paths run whatever the machine's speed; ranks 0 and
# 3, whose connections were made at once, must wait the 10 s for the others rather than call
# them silent (5 s).
hold_up() {  # HOST FROM: HOST drops the data segments FROM sends it
    ip netns exec "$(ns "$1")" nft -f - <<EOF || { echo "FAIL: nft"; exit 1; }
table inet chorus_outage {
    chain input {
        type filter hook input priority 0; policy accept;
        ip saddr $2 ip length > 60 counter drop
    }
}
EOF
}
refusals() {  # HOST FROM: how many connections from FROM HOST's gate refused for their silence
    grep -c "refused a connection from $2 port [0-9]*: no handshake within" "$tmp/outage.$1.err" 2>/dev/null
}
lift_when_refused() {  # HOST FROM COUNT: once HOST's gate refused COUNT connections from FROM, its drop goes
    for _ in $(seq 600); do
        [ "$(refusals "$1" "$2")" -ge "$3" ] && break
        sleep 0.1
    done
    ip netns exec "$(ns "$1")" nft delete table inet chorus_outage
}
hold_up 0 192.0.2.11
hold_up 1 192.0.2.12
{ lift_when_refused 0 192.0.2.11 1; lift_when_refused 1 192.0.2.12 2; } &
lifter=$!
job outage 192.0.2.10 -- "$check" stress 2027 10
wait "$lifter"
for h in 0 1; do
    from=192.0.2.$((11 + h))
    [ "$(refusals $h $from)" -ge $((h + 1)) ] ||
        { echo "FAIL: host $h refused $(refusals $h $from) held-up connections from $from, not $((h + 1)) (the outage did not happen)"; failures=$((failures + 1)); }
done

# A blackholed host: in the middle of an allreduce loop host 2 drops every packet, in and out
# (no FIN, no RST: a crashed machine or a cut cable). Every other host must name rank 2 and
# exit within 10 s, though the collective timeout is 60 s.
pids=()
for i in $(seq 0 $((hosts - 1))); do
    ip netns exec "$(ns "$i")" "$run" --nnodes $hosts --node-rank "$i" -n 1 --master-addr 192.0.2.10 \
        --master-port 29500 --timeout-ms 60000 "$check" loop >"$tmp/hole.$i.out" 2>"$tmp/hole.$i.err" &
    pids+=($!)
done
for _ in $(seq 300); do
    [ "$(cat "$tmp"/hole.*.out 2>/dev/null | grep -c 'in the allreduce loop')" -eq $hosts ] && break
    sleep 0.1
done
sleep 0.5
ip netns exec "$(ns 2)" nft -f - <<'EOF' || { echo "FAIL: nft"; exit 1; }
table inet chorus_hole {
    chain input { type filter hook input priority 0; policy drop; }
    chain output { type filter hook output priority 0; policy drop; }
}
EOF
holed=$(date +%s%3N)
bad=0
for i in 0 1 3; do
    wait "${pids[$i]}"
    rc=$? end=$(date +%s%3N)
    line=$(grep "rank $i: error at" "$tmp/hole.$i.err" | head -1)
    echo "host $i exited $rc $((end - holed)) ms after host 2 went dark: ${line#*ms: }"
    case $line in *"rank 2"*) ;; *) bad=1 ;; esac
    { [ "$rc" -ne 0 ] && [ $((end - holed)) -lt 10000 ]; } || bad=1
done
kill -KILL "${pids[2]}" 2>/dev/null
wait "${pids[2]}" 2>/dev/null
if [ "$bad" -ne 0 ]; then
    echo "FAIL: blackholed host"
    cat "$tmp"/hole.*.err
    failures=$((failures + 1))
else
    echo "ok: blackholed host named by every other host"
fi

# Two hosts of two ranks over node_transport, nodes told apart by their hostnames: shared memory
# inside a host, TCP between the hosts, the hierarchical allreduce. The whole matrix, the stress
# run and the seed's allreduce program; host 1's TCP packets are counted, so a job that kept its
# hosts' traffic in one place (every rank on one node) fails.
count_tcp_in 1 chorus_nodes eth0
job_hosts=2 job_ranks=2 job nodes-matrix 192.0.2.10 -- "$check" --transport node matrix
for i in 0 1; do
    grep -q "rank $((2 * i + 1)): node $i of 2, 2 ranks on it" "$tmp/nodes-matrix.$i.out" 2>/dev/null ||
        { echo "FAIL: host $i's ranks are not one node of two: $(cat "$tmp/nodes-matrix.$i.out" 2>/dev/null | head -2)"; failures=$((failures + 1)); }
done
job_hosts=2 job_ranks=2 job nodes-stress 192.0.2.10 -- "$check" --transport node stress 2027 30
for e in "${examples[@]}"; do
    case $e in *all_reduce*) job_hosts=2 job_ranks=2 show=1 job "nodes-example-$(basename "$e")" 192.0.2.10 CHORUS_TRANSPORT=node -- "$e" ;; esac
done
between=$(packets 1 chorus_nodes)
echo "host 1 received ${between:-0} TCP packets from the other host during the node_transport jobs"
[ "${between:-0}" -gt 2000 ] || { echo "FAIL: the hosts did not talk over TCP"; failures=$((failures + 1)); }

[ "$failures" -eq 0 ] || { echo "$failures job(s) failed"; exit 1; }
echo "all multi-host jobs passed"
