#!/usr/bin/env bash
# Builds and runs every test: the main build (unit, header-check and package tests, warnings
# as errors), then the unit tests again under ThreadSanitizer and under ASan + UBSan.
# Usage: tests/run_all.sh            (from anywhere; build trees go to build*/ in the checkout)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

run() {
    local dir=$1
    shift
    echo "=== $dir: $*"
    cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
    cmake --build "$dir" -j "$jobs"
    ctest --test-dir "$dir" --output-on-failure -j "$jobs"
}

run build -DCHORUS_WERROR=ON
run build-tsan -DCHORUS_SANITIZE=thread -DCHORUS_BUILD_EXAMPLES=OFF -DCHORUS_BUILD_BENCH=OFF
run build-asan -DCHORUS_SANITIZE=address,undefined -DCHORUS_BUILD_EXAMPLES=OFF -DCHORUS_BUILD_BENCH=OFF
echo "=== all tests passed"
