#!/usr/bin/env bash
# Packs what a device run needs into the checkout's git-ignored folders, within the device
# tool's 64 MiB carry (only the checkout and the carried paths reach the GPU machine):
#   build-gpu/      chorusrun, tests/cuda/cuda_ipc_test, bench/cuda_bench and
#                   examples/allreduce_cuda_ipc from a CUDA build, stripped (a RelWithDebInfo
#                   CUDA build is about 210 MB, these four 77 MB with their debug information,
#                   12 MB without), laid out as tests/gpu/run.sh and bench/gpu_compare.sh take a
#                   build directory; and build-gpu/cpu/ with chorusrun and bench/chorus_bench
#                   from a CPU build, for bench/torch_compare.sh;
#   gpu-peers/      cuda_ipc_probe.cu, torch_bench.py and tcp_bench.cpp from ../shared/peers.
# The binaries need no build on the GPU machine: cudart is linked statically, the device code
# is sm_90 plus PTX.
#
# Usage: tests/gpu/pack.sh [CUDA_BUILD_DIR] [CPU_BUILD_DIR]     (default build-cuda, build-bench)
# Then, with the device tool: carry ["build-gpu", "gpu-peers"], and run for instance
#   OUT=$OUT bash tests/gpu/run.sh build-gpu
#   bash bench/gpu_compare.sh build-gpu          (writes under $OUT/gpu-compare)
#   bash bench/torch_compare.sh build-gpu/cpu    (writes under $OUT/torch-compare)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cuda=${1:-$root/build-cuda}
cpu=${2:-$root/build-bench}
peers=${CHORUS_PEERS_DIR:-$root/../shared/peers}
pack=$root/build-gpu
rm -rf "$pack"
for f in chorusrun tests/cuda/cuda_ipc_test bench/cuda_bench examples/allreduce_cuda_ipc; do
    [ -x "$cuda/$f" ] || { echo "pack.sh: no $cuda/$f (build it: cmake --build $cuda --target chorusrun cuda_ipc_test cuda_bench allreduce_cuda_ipc)" >&2; exit 1; }
    mkdir -p "$(dirname "$pack/$f")"
    strip -o "$pack/$f" "$cuda/$f"
done
for f in chorusrun bench/chorus_bench; do
    if [ -x "$cpu/$f" ]; then
        mkdir -p "$(dirname "$pack/cpu/$f")"
        strip -o "$pack/cpu/$f" "$cpu/$f"
    else
        echo "pack.sh: no $cpu/$f: build-gpu/cpu left out (bench/torch_compare.sh then builds one on the GPU machine)" >&2
        rm -rf "$pack/cpu"
        break
    fi
done
mkdir -p "$root/gpu-peers"
for f in cuda_ipc_probe.cu torch_bench.py tcp_bench.cpp; do
    if [ -f "$peers/$f" ]; then cp "$peers/$f" "$root/gpu-peers/"; else echo "pack.sh: no $peers/$f" >&2; fi
done
du -sh "$pack" "$root/gpu-peers"
total=$(du -sk "$pack" "$root/gpu-peers" | awk '{ s += $1 } END { print s }')
if [ "$total" -gt $((64 * 1024)) ]; then
    echo "pack.sh: ${total} KiB, over the 64 MiB a device run can carry" >&2
    exit 1
fi
