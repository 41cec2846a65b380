#!/usr/bin/env bash
# The GPU check, for a machine with at least one NVIDIA GPU (sized for one H200: well under
# 8 minutes, so that a 15-minute device allowance leaves room for a rerun).
#   tests/gpu/run.sh [BUILD_DIR]     (default build-cuda; results also under $OUT if set)
# 1. Builds the CUDA targets (-DCHORUS_WITH_CUDA=ON) unless BUILD_DIR already has them (they can
#    be built on a machine without a GPU and carried: cudart is linked statically;
#    tests/gpu/pack.sh strips them into build-gpu/, small enough to carry).
# 2. Runs the CUDA test suite: every collective x algorithm x op x dtype on 2 and 4 ranks
#    sharing the GPU(s), and on 3 ranks through small FIFOs and one_shot slots (every message
#    many chunks, every one_shot collective of more than a few elements many rounds), the
#    generic tcp/cuda user function, the error tests, collectives on a program's stream (and
#    refused in a graph capture), a rank killed mid-collective, the example; then with signaled
#    launches forced on (CHORUS_CUDA_SIGNALS=1: without MPS, where the automatic choice leaves
#    them off, each launch waits for a time slice, slower but the same results): the matrix at 2
#    ranks, one_shot's mismatch, and a signaled allreduce captured into a CUDA graph and replayed
#    (the streams step). Here a skip (exit 77: no
#    usable GPU, e.g. a driver older than the toolkit) is a failure.
# 3. Runs cuda_bench at 2 and 4 ranks, 4 KiB to 1 GiB (allreduce, allgather, broadcast), with
#    the device-to-device cudaMemcpy ceiling of the same run, and every algorithm (one_shot
#    among them) from 8 B to 4 MiB at 2 ranks.
# The step limits add up to 585 s, so that with carried binaries even a run whose every step
# hangs ends, with its summary, inside one 600 s device command (building here first adds up
# to 300 s: then give the command the full 600 s and expect the steps to take far less).
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-cuda}
out=${OUT:-$build/gpu-results}
mkdir -p "$out"
log() { echo "=== $*" | tee -a "$out/summary.txt"; }
status=0

log "gpu check $(date -u +%FT%TZ) on $(hostname), $(nproc) cores"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,compute_mode --format=csv,noheader | tee -a "$out/summary.txt"

need="$build/chorusrun $build/tests/cuda/cuda_ipc_test $build/bench/cuda_bench $build/examples/allreduce_cuda_ipc"
missing=0
for f in $need; do [ -x "$f" ] || missing=1; done
if [ $missing = 1 ]; then
    # Carrying a build made elsewhere saves this (minutes of nvcc); it needs Asio, doctest,
    # range-v3 and CMake here.
    log "building $build"
    generator=(); command -v ninja >/dev/null && generator=(-G Ninja)
    if ! cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCHORUS_WITH_CUDA=ON -DCHORUS_BUILD_TESTS=ON \
        >"$out/configure.log" 2>&1; then
        log "FAILED: configure"; tail -30 "$out/configure.log"; exit 1
    fi
    if ! timeout 300 cmake --build "$build" -j "$(nproc)" --target chorusrun cuda_ipc_test cuda_bench allreduce_cuda_ipc \
        >"$out/build.log" 2>&1; then
        log "FAILED: build"; tail -30 "$out/build.log"; exit 1
    fi
fi

run=$build/chorusrun
step() {  # step NAME TIMEOUT_S COMMAND...: a GPU step that must exit 0 (77, "skipped", fails here)
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    if [ $rc = 0 ]; then log "passed: $name ($((SECONDS - start)) s)"; else log "FAILED: $name (exit $rc, $((SECONDS - start)) s)"; tail -20 "$out/$name.log"; status=1; fi
    grep -h "checks passed\|checks wrong" "$out/$name.log" | head -4 | tee -a "$out/summary.txt"
}

step matrix.p2 85 "$run" -n 2 --timeout-ms 30000 "$build/tests/cuda/cuda_ipc_test" matrix
step matrix.p4 85 "$run" -n 4 --timeout-ms 30000 "$build/tests/cuda/cuda_ipc_test" matrix
CHORUS_CUDA_CHUNK_BYTES=4096 CHORUS_CUDA_SLOTS=2 CHORUS_CUDA_DIRECT_BYTES=256 \
    step matrix.small_fifo.p3 65 "$run" -n 3 --timeout-ms 30000 "$build/tests/cuda/cuda_ipc_test" matrix
step generic.p2 20 "$run" -n 2 --timeout-ms 20000 "$build/tests/cuda/cuda_ipc_test" generic
step errors.p3 30 "$run" -n 3 --timeout-ms 20000 "$build/tests/cuda/cuda_ipc_test" errors
CHORUS_CUDA_SIGNALS=1 step streams.p2 20 "$run" -n 2 --timeout-ms 15000 "$build/tests/cuda/cuda_ipc_test" streams
CHORUS_CUDA_SIGNALS=1 step matrix.signals.p2 40 "$run" -n 2 --timeout-ms 30000 "$build/tests/cuda/cuda_ipc_test" matrix
step one_shot_errors.p3 15 "$run" -n 3 --timeout-ms 20000 "$build/tests/cuda/cuda_ipc_test" one_shot_errors
CHORUS_CUDA_SIGNALS=1 step one_shot_errors.signals.p3 15 "$run" -n 3 --timeout-ms 20000 "$build/tests/cuda/cuda_ipc_test" one_shot_errors
step one_shot_limit_errors.p3 15 "$run" -n 3 --timeout-ms 20000 "$build/tests/cuda/cuda_ipc_test" one_shot_limit_errors
# Rank 2 of 3 SIGKILLs itself mid-collective (chorusrun then exits non-zero): both others must
# throw naming it, within their timeout; the steps after this one start new groups on the GPU.
step killed.p3 20 bash -c "timeout 15 '$run' -n 3 --timeout-ms 10000 --stop-after-ms 5000 '$build/tests/cuda/cuda_ipc_test' killed;
    grep 'rank [01]: survived, naming rank 2' '$out/killed.p3.log' | wc -l | grep -qx 2"
step example.p2 30 "$run" -n 2 --timeout-ms 20000 "$build/examples/allreduce_cuda_ipc"

for n in 2 4; do
    step "bench.p$n" 60 "$run" --no-prefix -n "$n" --timeout-ms 60000 "$build/bench/cuda_bench" -b 4K -e 1G -f 4
    grep -v "^#" "$out/bench.p$n.log" | tee -a "$out/cuda_bench.txt" >/dev/null
done
# Every algorithm side by side up to 4 MiB at 2 ranks: where one_shot stops paying
# (CHORUS_CUDA_DIRECT_BYTES, 1 MiB by default, chosen without a GPU).
step bench.algos.p2 25 "$run" --no-prefix -n 2 --timeout-ms 60000 "$build/bench/cuda_bench" -b 8 -e 4M -f 8 --algo all
grep -v "^#" "$out/bench.algos.p2.log" | tee -a "$out/cuda_bench.txt" >/dev/null
log "bench rows: $out/cuda_bench.txt"
cat "$out/cuda_bench.txt"
[ $status = 0 ] && log "gpu check passed" || log "gpu check FAILED"
exit $status
