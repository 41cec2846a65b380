#!/usr/bin/env bash
# Builds and runs every test: the CUDA build where nvcc exists, the wire decoders' fuzz target
# for 60 s where clang exists, the main build (unit, header-check and package tests, warnings as
# errors), then the unit tests again under ThreadSanitizer and under ASan + UBSan.
# Usage: tests/run_all.sh            (from anywhere; build trees go to build*/ in the checkout)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
started=$SECONDS

# Compiling is most of the run on 2 cores, and full debug info a third of each compile: the
# trees take line tables only (-g1: file, line and function in every backtrace and sanitizer
# report). The main tree tests the -O2 code users build; the sanitizer trees compile at -O1,
# as the sanitizers' own documentation suggests, in half the time of -O2 -g.
# The sanitizer trees leave out the 8-rank process matrices: eight processes on two cores for
# a minute each under ThreadSanitizer, on the code paths the 2- to 5-rank ones already take
# (the main tree runs them).
run() {
    local dir=$1 flags=$2 skip=$3
    shift 3
    echo "=== $dir: $flags $* (at $((SECONDS - started)) s)"
    cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$flags -DNDEBUG" "$@"
    cmake --build "$dir" -j "$jobs"
    ctest --test-dir "$dir" --output-on-failure -j "$jobs" ${skip:+-E "$skip"}
}

# CUDA first: where nvcc exists (CUDA 12 or later), everything CUDA builds, sm_90 and portable
# PTX, and the CUDA tests run; without a GPU they report skipped, with the reason below. First,
# so that the run ends with the summary of the tests that did run, not with a list of skips.
nvcc=$(command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; } || true)
if [ -n "$nvcc" ]; then
    echo "=== build-cuda: $nvcc (at $((SECONDS - started)) s)"
    cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DCHORUS_WITH_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" \
        -DCHORUS_WERROR=ON
    cmake --build build-cuda -j "$jobs" --target chorusrun cuda_ipc_test allreduce_cuda_ipc cuda_bench chorus_nvcc_header_checks
    ctest --test-dir build-cuda --output-on-failure -j "$jobs" -L cuda
    reason=$(build-cuda/tests/cuda/cuda_ipc_test matrix 2>&1 | grep SKIPPED || true)
    [ -z "$reason" ] || echo "CUDA tests: $reason"
else
    echo "=== no nvcc: the CUDA transport is not built (install CUDA 12+ for it)"
fi

# The libFuzzer target for the TCP wire decoders, at most 60 s (clang only).
if command -v clang++ >/dev/null; then
    echo "=== build-fuzz: clang++ libFuzzer (at $((SECONDS - started)) s)"
    cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ -DCHORUS_BUILD_FUZZ=ON \
        -DCHORUS_BUILD_TESTS=OFF -DCHORUS_BUILD_EXAMPLES=OFF -DCHORUS_BUILD_BENCH=OFF -DCHORUS_INSTALL=OFF
    cmake --build build-fuzz -j "$jobs" --target wire_fuzz
    ctest --test-dir build-fuzz --output-on-failure -L fuzz
else
    echo "=== no clang++: the fuzz target is not built (install clang and libclang-rt-14-dev for it)"
fi

run build "-O2 -g1" "" -DCHORUS_WERROR=ON
# ThreadSanitizer orders by address: shared memory that two threads map twice (shm_transport's
# segments, ranks as threads) carries its happens-before at two addresses it cannot match. The
# shm tests pass because their data lives there too; the staged transport over an shm control
# channel keeps its host-model "device" memory on the heap, at one address, so TSan sees its
# copies unordered. The same engine runs under TSan over a loopback control channel
# (staged_test.cpp), whose mutexes it sees.
tsan_blind="staged_factory|staged over shared memory"
run build-tsan "-O1 -g1" "matrix[.]p8|$tsan_blind" -DCHORUS_SANITIZE=thread -DCHORUS_BUILD_EXAMPLES=OFF -DCHORUS_BUILD_BENCH=OFF
run build-asan "-O1 -g1" "matrix[.]p8" -DCHORUS_SANITIZE=address,undefined -DCHORUS_BUILD_EXAMPLES=OFF -DCHORUS_BUILD_BENCH=OFF
echo "=== all tests passed in $((SECONDS - started)) s"
