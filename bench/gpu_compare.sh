#!/usr/bin/env bash
# chorus's CUDA IPC collectives next to a hand-written CUDA IPC kernel (cuda_ipc_probe from
# ../shared/peers: one kernel per collective reading the peers' IPC-mapped buffers), in one
# run on one GPU machine: with MPS, then without (ranks as processes sharing the GPU).
#
# Usage: bench/gpu_compare.sh [BUILD_DIR] [OUT_DIR]
#   BUILD_DIR  a CUDA build with chorusrun and cuda_bench (default build-cuda; built if missing,
#              which needs CMake, Asio, doctest and range-v3 there)
#   OUT_DIR    default $OUT/gpu-compare when $OUT is set (the device tool brings back only what
#              is under $OUT), else docs/bench/gpu/<UTC date>
# Environment:
#   PROBE_SRC       the probe's source (default: gpu-peers/cuda_ipc_probe.cu in the checkout —
#                   copy it there from ../shared/peers and carry gpu-peers/ along, since it is
#                   git-ignored and only the checkout reaches the GPU machine — else
#                   ../shared/peers/cuda_ipc_probe.cu). A probe built beforehand (nvcc needs no
#                   GPU) as gpu-peers/cuda_ipc_probe, newer than the source, is used as it is.
#   GPU_RANKS       "2 4"        GPU_MODES  "mps nomps"   GPU_ITER_SCALE 0.3
#   GPU_BEGIN       8            GPU_END    1G            GPU_FACTOR 4
#   GPU_STEP_S      37 (each program's limit: 18 programs by default, the 6 of MPS mode only
#                   (point to point, and the 16-bit allreduce) with half of it, 552 s in all, so
#                   that even a run whose every program hangs ends within one 10-minute device
#                   command)
# Writes to OUT_DIR: compare.txt (every raw row of both, nccl-tests columns, each program's rows
# under a "# ---- probe-p2-mps" / "# ---- chorus-p2-mps" line; the probe's algos end in _ipc,
# chorus's are `auto` and, up to 4 MiB, its named algorithms; sendrecv's are `rendezvous` or
# `chunks`, under "# ---- chorus-p2-mps-p2p1" and "-p2p0"; the 16-bit allreduce's `auto_half`
# and `auto_bf16` next to `auto`, under "-dtypes"), ratios.txt (chorus auto against the probe's
# best row of the same op, size, ranks and mode; then half and bfloat16 busbw against float32's),
# compare-busbw.png (with gnuplot).
# MPS is started by this script (as root) and stopped again; an MPS daemon already running is
# left alone for the "mps" mode and the "nomps" mode is then skipped, saying so.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$root/build-cuda}
out=${2:-${OUT:+$OUT/gpu-compare}}
out=${out:-$root/docs/bench/gpu/$(date -u +%F)}
ranks=${GPU_RANKS:-2 4}
modes=${GPU_MODES:-mps nomps}
scale=${GPU_ITER_SCALE:-0.3}
begin=${GPU_BEGIN:-8} end=${GPU_END:-1G} factor=${GPU_FACTOR:-4}
limit=${GPU_STEP_S:-37}
mkdir -p "$out"
compare=$out/compare.txt
say() { echo "=== $*" >&2; }

probe_src=${PROBE_SRC:-}
if [ -z "$probe_src" ]; then
    for c in "$root/gpu-peers/cuda_ipc_probe.cu" "$root/../shared/peers/cuda_ipc_probe.cu"; do
        [ -f "$c" ] && { probe_src=$c; break; }
    done
fi
[ -f "$probe_src" ] || { echo "gpu_compare.sh: no cuda_ipc_probe.cu (set PROBE_SRC, or copy it into gpu-peers/)" >&2; exit 1; }
command -v nvidia-smi >/dev/null || { echo "gpu_compare.sh: no nvidia-smi: not a GPU machine" >&2; exit 1; }
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)

if [ ! -x "$build/chorusrun" ] || [ ! -x "$build/bench/cuda_bench" ]; then
    say "building chorusrun and cuda_bench in $build"
    generator=(); command -v ninja >/dev/null && generator=(-G Ninja)
    cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCHORUS_WITH_CUDA=ON >"$out/configure.log" 2>&1 &&
        cmake --build "$build" -j "$(nproc)" --target chorusrun cuda_bench >"$out/build.log" 2>&1 ||
        { echo "gpu_compare.sh: build failed (see $out/build.log)" >&2; exit 1; }
fi
probe=$(dirname "$probe_src")/cuda_ipc_probe
[ -x "$probe" ] && [ "$probe" -nt "$probe_src" ] || probe=$build/cuda_ipc_probe
if [ ! -x "$probe" ] || [ "$probe_src" -nt "$probe" ]; then
    say "building the probe from $probe_src"
    "$nvcc" -O3 -std=c++20 -arch=sm_90 -o "$probe" "$probe_src" || { echo "gpu_compare.sh: nvcc failed on the probe" >&2; exit 1; }
fi

{
    echo "# chorus (cuda_ipc_transport, cuda_bench) and cuda_ipc_probe side by side, $(date -u +%FT%TZ)"
    echo "# chorus $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown); $(nproc) cores;" \
        "$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
    echo "# float32 sum (the -dtypes sections: float32, half and bfloat16); sizes $begin..$end x$factor; iterations x$scale; ranks $ranks; modes $modes"
} >"$compare"

mps_pipe=/tmp/chorus-mps
# Process names are cut to 15 characters: nvidia-cuda-mps-control and -server both read so.
mps_running() { pgrep -x nvidia-cuda-mps >/dev/null; }
started_mps=0
mps_start() {
    if mps_running; then say "MPS already running: used as it is"; return 0; fi
    export CUDA_MPS_PIPE_DIRECTORY=$mps_pipe CUDA_MPS_LOG_DIRECTORY=$mps_pipe-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    PATH=$PATH:/usr/local/nvidia/bin nvidia-cuda-mps-control -d || return 1
    started_mps=1
}
mps_stop() {
    [ "$started_mps" = 1 ] || return 0
    echo quit | PATH=$PATH:/usr/local/nvidia/bin nvidia-cuda-mps-control
    for _ in $(seq 50); do mps_running || break; sleep 0.1; done
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    started_mps=0
}
trap mps_stop EXIT

section() {  # section NAME COMMAND...: its rows into compare.txt under "# ---- NAME"
    local name=$1 start=$SECONDS
    shift
    echo "# ---- $name" >>"$compare"
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    grep -v '^\[' "$out/$name.log" >>"$compare"
    say "$name: exit $rc, $((SECONDS - start)) s"
    [ $rc = 0 ] || echo "# $name: exit $rc (see $name.log)" >>"$compare"
}

for mode in $modes; do
    if [ "$mode" = mps ]; then
        mps_start || { say "MPS did not start: mode mps skipped"; echo "# mps: did not start" >>"$compare"; continue; }
    elif mps_running; then
        say "MPS runs (not started here): mode nomps skipped"; echo "# nomps: skipped, an MPS daemon runs" >>"$compare"; continue
    fi
    for p in $ranks; do
        section "probe-p$p-$mode" "$probe" -p "$p" -b "$begin" -e "$end" -f "$factor" --iters-scale "$scale"
        section "chorus-p$p-$mode" "$build/chorusrun" --no-prefix -n "$p" --timeout-ms 60000 "$build/bench/cuda_bench" \
            -b "$begin" -e "$end" -f "$factor" --iter-scale "$scale" --ops allreduce,allgather,broadcast,reduce_scatter,alltoall
        section "chorus-p$p-$mode-algos" "$build/chorusrun" --no-prefix -n "$p" --timeout-ms 60000 "$build/bench/cuda_bench" \
            -b "$begin" -e 4M -f "$factor" --iter-scale "$scale" --algo all --ops allreduce,allgather,reduce_scatter,alltoall,alltoallv
        [ "$mode" = mps ] || continue
        # Half and bfloat16 allreduce next to float32 in one program (MPS only), 64 MiB to 1 GiB:
        # the target is a 16-bit type's busbw within 10% of float32's.
        limit=$((limit / 2)) section "chorus-p$p-$mode-dtypes" "$build/chorusrun" --no-prefix -n "$p" --timeout-ms 60000 \
            "$build/bench/cuda_bench" -b 64M -e 1G -f 4 --iter-scale "$scale" --ops allreduce --dtype float,half,bf16
        # Point to point around the ring (MPS only): every size by rendezvous, then every size
        # in chunks through the FIFOs.
        for way in 1 0; do
            limit=$((limit / 2)) section "chorus-p$p-$mode-p2p$way" env CHORUS_CUDA_RENDEZVOUS_BYTES=$way "$build/chorusrun" --no-prefix -n "$p" \
                --timeout-ms 60000 "$build/bench/cuda_bench" -b "$begin" -e "$end" -f "$factor" --iter-scale "$scale" --ops sendrecv
        done
    done
    [ "$mode" = mps ] && mps_stop
done

# ratios.txt: chorus auto against the probe's best (lowest time) row of the same op, bytes,
# ranks and mode; speed = probe time / chorus time (1 = level; the target is >= 0.9 at 1 GiB).
awk '
    /^# ---- / { split($3, part, "-"); lib = part[1]; mode = part[3]; algos = (part[4] != ""); dtypes = (part[4] == "dtypes"); next }
    /^#/ || NF != 9 || $1 == "op" || $1 == "ceiling" { next }
    {
        key = mode " " $1 " " $3 " " $4
        if (lib == "probe" && $9 == 0 && (!(key in probe) || $6 < probe[key])) { probe[key] = $6; palgo[key] = $2; pbus[key] = $8 }
        if (lib == "chorus" && !algos && $2 == "auto") { chorus[key] = $6; cbus[key] = $8; cwrong[key] = $9 }
        if (dtypes) { bus[key " " $2] = $8; bad[key " " $2] = $9; if ($2 == "auto") sized[key] = 1 }
    }
    END {
        printf "# chorus (auto) / cuda_ipc_probe (best algo), float32 sum, same run; speed = probe time / chorus time\n"
        printf "%-6s %-10s %5s %12s %12s %12s %-14s %11s %11s %7s %6s\n", "mode", "op", "ranks", "bytes", "chorus_us", "probe_us", "probe_algo", "chorus_bus", "probe_bus", "speed", "wrong"
        for (k in chorus) if (k in probe) {
            split(k, f, " ")
            printf "%-6s %-10s %5s %12s %12.2f %12.2f %-14s %11.2f %11.2f %7.3f %6s\n", f[1], f[2], f[3], f[4], chorus[k], probe[k], palgo[k], cbus[k], pbus[k], probe[k] / chorus[k], cwrong[k]
        }
        # The 16-bit table after a line "~" that splits the two for sorting (below).
        print "~"
        printf "# allreduce busbw of half and bfloat16 against float32, same program (target: >= 0.9)\n"
        printf "%-6s %5s %12s %11s %11s %11s %7s %7s %6s\n", "mode", "ranks", "bytes", "float_bus", "half_bus", "bf16_bus", "half_x", "bf16_x", "wrong"
        for (k in sized) {
            split(k, f, " ")
            fb = bus[k " auto"]; hb = bus[k " auto_half"]; bb = bus[k " auto_bf16"]
            printf "%-6s %5s %12s %11.2f %11.2f %11.2f %7.3f %7.3f %6d\n", f[1], f[3], f[4], fb, hb, bb, (fb > 0 ? hb / fb : 0), (fb > 0 ? bb / fb : 0), bad[k " auto"] + bad[k " auto_half"] + bad[k " auto_bf16"]
        }
    }' "$compare" >"$out/ratios.raw"
{   # each table's two header lines, then its rows sorted
    sed -n '1,2p' "$out/ratios.raw"
    sed -n '3,$p' "$out/ratios.raw" | sed '/^~$/,$d' | sort -k1,1 -k2,2 -k3,3n -k4,4n
    sed -n '/^~$/,$p' "$out/ratios.raw" | sed -n '2,3p'
    sed -n '/^~$/,$p' "$out/ratios.raw" | tail -n +4 | sort -k1,1 -k2,2n -k3,3n
} >"$out/ratios.txt"
rm -f "$out/ratios.raw"
cat "$out/ratios.txt"

if command -v gnuplot >/dev/null; then
    # allreduce busbw against size: chorus auto and the probe's best, per mode and rank count.
    awk '
        /^# ---- / { split($3, part, "-"); lib = part[1]; p = part[2]; mode = part[3]; algos = (part[4] != ""); next }
        /^#/ || NF != 9 || $1 != "allreduce" || algos { next }
        lib == "chorus" && $2 == "auto" { print lib "-" p "-" mode, $4, $8 }
        lib == "probe" && ($2 ~ /_ipc$/) { k = lib "-" p "-" mode " " $4; if (!(k in best) || $8 > best[k]) best[k] = $8 }
        END { for (k in best) { split(k, f, " "); print f[1], f[2], best[k] } }' "$compare" | sort -k1,1 -k2,2n >"$out/allreduce-busbw.dat"
    series=$(cut -d' ' -f1 "$out/allreduce-busbw.dat" | sort -u)
    plot=""
    for s in $series; do
        plot+="${plot:+, }'< grep \"^$s \" $out/allreduce-busbw.dat' using 2:3 with linespoints title '$s'"
    done
    [ -n "$plot" ] && gnuplot -e "set terminal png size 1000,600; set output '$out/compare-busbw.png'; set logscale x 2;
        set xlabel 'bytes'; set ylabel 'allreduce busbw (GB/s)'; set key left top; plot $plot" &&
        rm -f "$out/allreduce-busbw.dat"
fi
say "wrote $out"
