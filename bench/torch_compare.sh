#!/usr/bin/env bash
# chorus over TCP and over shared memory next to torch.distributed's Gloo backend (what a
# PyTorch user gets), in one run on this machine: ../shared/peers/torch_bench.py, chorus_bench
# (--transport tcp, then shm; chorus's automatic choice) and the loopback TCP single-stream
# ceiling (../shared/peers/tcp_bench.cpp), on the same sizes and rank counts. Issue 17 asks for
# this on a 16-core machine (the GPU machine, with torch 2.11): chorus tcp >= 1.3x torch's Gloo
# from 1 MiB, and the allreduce's busbw >= 60% of one stream.
#
# Usage: bench/torch_compare.sh [BUILD_DIR] [OUT_DIR]
#   BUILD_DIR  a build with chorusrun and bench/chorus_bench (default build-bench; configured
#              and built if missing: CMake, Asio, doctest and range-v3 needed then)
#   OUT_DIR    default $OUT/torch-compare when $OUT is set (the device tool brings back only what
#              is under $OUT), else docs/bench/torch/<UTC date>
# Environment:
#   TORCH_PYTHON    an interpreter with torch (default: the first of python3 on PATH,
#                   /usr/bin/python3 that imports torch.distributed with Gloo)
#   TORCH_BENCH     torch_bench.py (default gpu-peers/torch_bench.py in the checkout — copy it
#                   there from ../shared/peers and carry gpu-peers/ along to a device machine —
#                   else ../shared/peers/torch_bench.py); TCP_BENCH_SRC likewise tcp_bench.cpp
#   TORCH_RANKS     default "4 8" with 8 or more cores, else "2 4"
#   TORCH_SIZES     8,1M,16M,64M      TORCH_OPS  allreduce,broadcast,allgather,reduce_scatter,alltoall,alltoallv
#   TORCH_ITER_SCALE 0.5              COMPARE_ROUNDS 1 (each row: the fastest round's median)
#   TORCH_STEP_S    300 (each program's limit; torch_bench took 140 s for 4 ranks on 2 cores)
# Writes to OUT_DIR: torch.txt and chorus.txt (raw rows), tcp_bench.txt, machine.txt and
# ratios.txt (per op, ranks and size: torch's time, chorus tcp's and shm's, and the speed-ups
# torch time / chorus time; for allreduce the tcp busbw as a share of the best single stream).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$root/build-bench}
out=${2:-${OUT:+$OUT/torch-compare}}
out=${out:-$root/docs/bench/torch/$(date -u +%F)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
say() { echo "=== $*" >&2; }
pick() {  # pick ENV_VALUE NAME: the file given, else gpu-peers/NAME, else ../shared/peers/NAME
    local given=$1 name=$2
    if [ -n "$given" ]; then echo "$given"; return; fi
    for c in "$root/gpu-peers/$name" "$root/../shared/peers/$name"; do
        [ -f "$c" ] && { echo "$c"; return; }
    done
}
torch_bench=$(pick "${TORCH_BENCH:-}" torch_bench.py)
tcp_src=$(pick "${TCP_BENCH_SRC:-}" tcp_bench.cpp)
[ -f "$torch_bench" ] || { echo "torch_compare.sh: no torch_bench.py (set TORCH_BENCH, or copy it into gpu-peers/)" >&2; exit 1; }
python=${TORCH_PYTHON:-}
if [ -z "$python" ]; then
    for c in python3 /usr/bin/python3; do
        if "$c" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null; then python=$c; break; fi
    done
fi
[ -n "$python" ] || { echo "torch_compare.sh: no python with torch.distributed and Gloo (set TORCH_PYTHON; Debian: apt-get install python3-torch)" >&2; exit 1; }
cores=$(nproc)
ranks=${TORCH_RANKS:-$([ "$cores" -ge 8 ] && echo "4 8" || echo "2 4")}
sizes=${TORCH_SIZES:-8,1M,16M,64M}
ops=${TORCH_OPS:-allreduce,broadcast,allgather,reduce_scatter,alltoall,alltoallv}
scale=${TORCH_ITER_SCALE:-0.5}
rounds=${COMPARE_ROUNDS:-1}
limit=${TORCH_STEP_S:-300}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "torch_compare.sh: COMPARE_ROUNDS must be a positive whole number, not '$rounds'" >&2; exit 1; }

# A CMake build directory is brought up to date (so the rows are this checkout's); one without
# CMake's cache (tests/gpu/pack.sh's build-gpu/cpu, stripped binaries) is taken as it is.
if [ -f "$build/CMakeCache.txt" ] || [ ! -x "$build/chorusrun" ] || [ ! -x "$build/bench/chorus_bench" ]; then
    say "building chorusrun and chorus_bench in $build"
    if [ ! -f "$build/CMakeCache.txt" ]; then
        generator=(); command -v ninja >/dev/null && generator=(-G Ninja)
        cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCHORUS_BUILD_TESTS=OFF -DCHORUS_BUILD_EXAMPLES=OFF \
            >"$out/configure.log" 2>&1 || { echo "torch_compare.sh: configure failed (see $out/configure.log)" >&2; exit 1; }
    fi
    cmake --build "$build" -j "$cores" --target chorusrun chorus_bench >"$out/build.log" 2>&1 ||
        { echo "torch_compare.sh: build failed (see $out/build.log)" >&2; exit 1; }
    rm -f "$out/configure.log" "$out/build.log"
fi
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "cpus: $cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'))"
    echo "torch: $("$python" -c 'import torch; print(torch.__version__)') ($python)"
    echo "chorus: $(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown) (binaries in $build)"
    echo "ranks: $ranks; sizes: $sizes; iterations x$scale; rounds: $rounds (each row: the fastest round's median)"
} | tee "$out/machine.txt"

# One stream one way: the ceiling the allreduce's busbw is held to.
: >"$out/tcp_bench.txt"
if [ -f "$tcp_src" ] && ${CXX:-g++} -std=c++20 -O2 -o "$out/tcp_bench" "$tcp_src" 2>"$out/tcp_bench.build.log"; then
    timeout 60 "$out/tcp_bench" | tee "$out/tcp_bench.txt"
    rm -f "$out/tcp_bench" "$out/tcp_bench.build.log"
else
    say "no tcp_bench (source $tcp_src): no single-stream ceiling"
fi

step() {  # step FILE COMMAND...: its rows appended to FILE, bounded by the limit
    local file=$1 start=$SECONDS
    shift
    timeout "$limit" "$@" >"$out/step.log" 2>&1
    local rc=$?
    grep -v '^\[' "$out/step.log" >>"$file"
    say "$(basename "$file") $*: exit $rc, $((SECONDS - start)) s"
    [ $rc = 0 ] || echo "# exit $rc: $*" >>"$file"
}
: >"$out/torch.txt"
: >"$out/chorus.txt"
for round in $(seq 1 "$rounds"); do
    echo "# round $round of $rounds" | tee -a "$out/torch.txt" >>"$out/chorus.txt"
    for n in $ranks; do
        # The launcher waits for an idle machine before each rank count (30 s at most here), and
        # prints a rank count's rows only once its run ended: its own limit, inside this step's,
        # and no retry, so that a slow run still reports what it measured.
        idle=${PEERS_IDLE_WAIT_S:-30}
        step "$out/torch.txt" env PEERS_SIZES="$sizes" PEERS_OPS="$ops" PEERS_ITER_SCALE="$scale" PEERS_IDLE_WAIT_S="$idle" \
            PEERS_TIMEOUT_S=$((limit - idle - 20)) PEERS_RETRIES="${PEERS_RETRIES:-0}" "$python" "$torch_bench" --ranks "$n"
        for transport in tcp shm; do
            step "$out/chorus.txt" "$build/chorusrun" --no-prefix -n "$n" "$build/bench/chorus_bench" --sizes "$sizes" --ops "$ops" \
                --algo auto --transport "$transport" --iter-scale "$scale"
        done
    done
done
rm -f "$out/step.log"

# ratios.txt: per op, ranks and bytes the fastest round's median of each; speed-up = torch's
# time / chorus's (> 1: chorus faster); stream_pct = the tcp allreduce's busbw / the best stream.
awk '
    /^ceiling tcp_stream/ { for (i = 1; i <= NF; i++) if ($i ~ /^GBps=/) { g = substr($i, 6) + 0; if (g > stream) stream = g } next }
    /^# exit/ { failed = failed "\n# step failed: " substr($0, 3) }
    /^#/ || NF < 9 || $1 == "op" || $5 ~ /[^0-9]/ { next }
    {
        key = $1 " " $3 " " $4
        if ($2 == "torch_gloo") lib = "torch"; else if ($2 == "auto") lib = "tcp"; else if ($2 == "shm:auto") lib = "shm"; else next
        if (!((key, lib) in t) || $6 < t[key, lib]) { t[key, lib] = $6; bus[key, lib] = $8 }
        w[key, lib] += $9
        keys[key] = 1
    }
    function cell(key, lib) { return ((key, lib) in t) ? sprintf("%12.1f", t[key, lib]) : sprintf("%12s", "-") }
    function speed(key, lib) { return ((key, "torch") in t && (key, lib) in t && t[key, lib] > 0) ? sprintf("%8.2f", t[key, "torch"] / t[key, lib]) : sprintf("%8s", "-") }
    END {
        printf "# torch.distributed (Gloo) against chorus (automatic choice), same run; x = torch time / chorus time; single stream %s%s\n", (stream > 0 ? sprintf("%.2f GB/s", stream) : "none (no tcp_bench)"), failed
        printf "%-15s %5s %12s %12s %12s %8s %12s %8s %10s %10s %6s\n", "op", "ranks", "bytes", "torch_us", "tcp_us", "tcp_x", "shm_us", "shm_x", "tcp_busbw", "stream_pct", "wrong"
        for (k in keys) {
            split(k, f, " ")
            pct = (f[1] == "allreduce" && stream > 0 && (k, "tcp") in bus) ? sprintf("%10.0f", 100 * bus[k, "tcp"] / stream) : sprintf("%10s", "-")
            tb = ((k, "tcp") in bus) ? sprintf("%10.3f", bus[k, "tcp"]) : sprintf("%10s", "-")
            printf "%-15s %5s %12s %s %s %s %s %s %s %s %6d\n", f[1], f[2], f[3], cell(k, "torch"), cell(k, "tcp"), speed(k, "tcp"), cell(k, "shm"), speed(k, "shm"), tb, pct, w[k, "torch"] + w[k, "tcp"] + w[k, "shm"]
        }
    }' "$out/tcp_bench.txt" "$out/torch.txt" "$out/chorus.txt" >"$out/ratios.raw"
{ grep '^#\|^op ' "$out/ratios.raw"; grep -v '^#\|^op ' "$out/ratios.raw" | sort -k1,1 -k2,2n -k3,3n; } >"$out/ratios.txt"
rm -f "$out/ratios.raw"
cat "$out/ratios.txt"
