// SPDX-License-Identifier: MIT
// reduce_scatter: every rank holds p blocks, block j of rank r being r * 10 + j;
// chorus::reduce_scatter sums them over ranks and gives rank i only block i of the sum,
// sum over r of (10 r + i) = 10 p (p - 1) / 2 + p i: 60, 64, 68, 72 for 4 ranks (FSDP's
// gradient sharding). Works for any number of ranks.
//
// Usage: chorusrun -n 4 build/examples/reduce_scatter
//
// Expected output (lines of different ranks may interleave):
//   [rank0] before = [0.0, 1.0, 2.0, 3.0]
//   [rank1] before = [10.0, 11.0, 12.0, 13.0]
//   [rank2] before = [20.0, 21.0, 22.0, 23.0]
//   [rank3] before = [30.0, 31.0, 32.0, 33.0]
//   [rank0] after, global sum of block 0 only = [60.0]
//   [rank1] after, global sum of block 1 only = [64.0]
//   [rank2] after, global sum of block 2 only = [68.0]
//   [rank3] after, global sum of block 3 only = [72.0]

#include "example_util.hpp"
#include <cstddef>
#include <iostream>
#include <vector>

#include <chorus/chorus.hpp>
#include <chorus/transport/tcp.hpp>

namespace {

int run(auto& tp) {
    auto const world = static_cast<std::size_t>(tp.size());
    int const rank = tp.rank();
    std::vector<float> blocks(world);
    for (std::size_t j = 0; j < world; ++j) blocks[j] = static_cast<float>(rank * 10) + static_cast<float>(j);
    std::vector<float> mine(1, 0.0f);
    std::cout << "before = " << example::format_list(blocks) << std::endl;

    chorus::reduce_scatter(tp, blocks, mine, chorus::sum{});

    std::cout << "after, global sum of block " << rank << " only = " << example::format_list(mine) << std::endl;
    float const p = static_cast<float>(world);
    float const expected = 10.0f * p * (p - 1.0f) / 2.0f + p * static_cast<float>(rank);
    if (mine[0] != expected) {
        std::cerr << "reduce_scatter: rank " << rank << " got " << example::format_value(mine[0]) << ", expected "
                  << example::format_value(expected) << std::endl;
        return 1;
    }
    return 0;
}

} // namespace

int main() { return example::run_rank([](auto& tp) { return run(tp); }); }
