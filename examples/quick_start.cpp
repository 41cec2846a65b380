// SPDX-License-Identifier: MIT
// The README's opening program: four ranks as threads of one process (loopback_transport), a
// gradient averaged with allreduce AVG and a reduce_scatter on the ring. README.md shows this
// file from its first #include on; a test checks that the two agree.
//
// Usage: build/examples/quick_start
//
// Prints (lines in any order):
//   [rank0] avg 2.5, block sum 60
//   [rank1] avg 2.5, block sum 64
//   [rank2] avg 2.5, block sum 68
//   [rank3] avg 2.5, block sum 72

#include <chorus/chorus.hpp>
#include <cstdio>
#include <vector>

int main() {
    // Four ranks as threads of this process; swap in chorus::tcp_transport for processes.
    chorus::run_ranks(4, [](chorus::loopback_transport& tp) {
        std::vector<float> grad{float(tp.rank() + 1)};      // 1, 2, 3, 4
        chorus::allreduce(tp, grad, chorus::avg{});         // data-parallel gradient sync
        std::vector<float> blocks, mine(1);
        for (int j = 0; j < 4; ++j) blocks.push_back(float(tp.rank() * 10 + j));
        chorus::reduce_scatter<chorus::ring>(tp, blocks, mine, chorus::sum{});
        std::printf("[rank%d] avg %g, block sum %g\n", tp.rank(), grad[0], mine[0]);  // 2.5, 60+4r
    });
}
