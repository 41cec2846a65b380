#!/usr/bin/env bash
# chorus (over TCP and over shared memory) side by side with Gloo and Open MPI (TCP and shared
# memory), in one run, on this machine: builds the peers' benchmarks from ../shared/peers (see
# its README), runs them and chorus_bench (--transport tcp, then shm) on the same sizes and rank
# counts, and prints the ratio table; with gnuplot it also draws busbw against size
# (compare-busbw.png).
#
# Usage: bench/compare.sh [OUT_DIR]          (default build/compare; as root for apt-get)
# Environment: PEERS_RANKS="2 4", PEERS_SIZES=8,1K,64K,1M,16M,64M, PEERS_ITER_SCALE (quick runs),
#   COMPARE_ROUNDS=2, CHORUS_PEERS_DIR (default ../shared/peers), CHORUS_COMPARE_NO_DEPS=1 (skip apt-get).
# Rounds: the peers, then chorus, COMPARE_ROUNDS times in turn; every row of the table is the
# fastest of its rounds' medians, for every library alike. On a shared VM a minute can run 1.5-2.5x
# slower than the next (chorus's 2-rank 64 MiB TCP broadcast: 16.1 ms in one pass of 2026-12-06,
# 6.3-7.4 ms in seven passes within the hour), and one round would charge that to whoever ran then.
# Outputs in OUT_DIR: peers.txt and chorus.txt (raw rows), two_way.txt (loopback TCP each way at
# once: bench/two_way_bench.cpp), ratios.txt, machine.txt, compare-busbw.png.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
peers=${CHORUS_PEERS_DIR:-$root/../shared/peers}
out=$(mkdir -p "${1:-$root/build/compare}" && cd "${1:-$root/build/compare}" && pwd)
export PEERS_RANKS=${PEERS_RANKS:-2 4}
export PEERS_SIZES=${PEERS_SIZES:-8,1K,64K,1M,16M,64M}
rounds=${COMPARE_ROUNDS:-2}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "compare.sh: COMPARE_ROUNDS must be a positive whole number, not '$rounds'" >&2; exit 1; }
[ -f "$peers/run.sh" ] || { echo "compare.sh: no peers at $peers (set CHORUS_PEERS_DIR)" >&2; exit 1; }

if [ -z "${CHORUS_COMPARE_NO_DEPS:-}" ]; then
    bash "$peers/deps.sh"
    apt-get install -y --no-install-recommends cmake ninja-build libasio-dev doctest-dev librange-v3-dev gnuplot-nox >/dev/null
fi
bash "$peers/build.sh" "$out/peers-build"
cmake -S "$root" -B "$root/build-bench" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCHORUS_BUILD_TESTS=OFF -DCHORUS_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$root/build-bench" --target chorusrun chorus_bench two_way_bench

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "cpus: $(nproc) ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'))"
    echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
    echo "kernel: $(uname -r)"
    echo "compiler: $(${CXX:-g++} --version | head -1)"
    echo "chorus: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
} | tee "$out/machine.txt"

echo "rounds: $rounds (each row: the fastest round's median)" >>"$out/machine.txt"
# The peers' tcp_bench is one stream one way; two ranks send and receive at once.
"$root/build-bench/bench/two_way_bench" 16 64 | tee "$out/two_way.txt"
: >"$out/peers.txt"
: >"$out/chorus.txt"
for round in $(seq 1 "$rounds"); do
    echo "# round $round of $rounds" | tee -a "$out/peers.txt" "$out/chorus.txt"
    # Peers first (their run.sh waits for an idle machine per section), then chorus right after;
    # the machine's ceilings once.
    sections="gloo mpi_tcp mpi_shm"
    [ "$round" = 1 ] && sections="ceilings $sections"
    # shellcheck disable=SC2086
    bash "$peers/run.sh" "$out/peers-build" $sections | tee -a "$out/peers.txt"
    for n in $PEERS_RANKS; do
        for transport in tcp shm; do
            "$root/build-bench/chorusrun" --no-prefix -n "$n" "$root/build-bench/bench/chorus_bench" --sizes "$PEERS_SIZES" \
                --algo all --transport "$transport" --iter-scale "${PEERS_ITER_SCALE:-1}" | tee -a "$out/chorus.txt"
        done
    done
done

awk -f "$root/bench/ratios.awk" "$out/peers.txt" "$out/chorus.txt" | tee "$out/ratios.txt"

if command -v gnuplot >/dev/null; then
    bash "$root/bench/plot.sh" "$out" && echo "plot: $out/compare-busbw.png"
fi
