// SPDX-License-Identifier: MIT
// allgather: every rank holds one value, its rank number; after chorus::allgather every
// rank holds all of them in rank order, [0, 1, 2, 3] (gather's result, but on every rank).
// Works for any number of ranks.
//
// Usage: chorusrun -n 4 build/examples/all_gather
//
// Expected output (lines of different ranks may interleave):
//   [rank0] before local = [0.0]
//   [rank1] before local = [1.0]
//   [rank2] before local = [2.0]
//   [rank3] before local = [3.0]
//   [rank0] after gathered = [0.0, 1.0, 2.0, 3.0]
//   [rank1] after gathered = [0.0, 1.0, 2.0, 3.0]
//   [rank2] after gathered = [0.0, 1.0, 2.0, 3.0]
//   [rank3] after gathered = [0.0, 1.0, 2.0, 3.0]

#include "example_util.hpp"
#include <cstddef>
#include <iostream>
#include <vector>

#include <chorus/chorus.hpp>
#include <chorus/transport/tcp.hpp>

namespace {

int run(auto& tp) {
    auto const world = static_cast<std::size_t>(tp.size());
    std::vector<float> const local{static_cast<float>(tp.rank())};
    std::vector<float> gathered(world, 0.0f);
    std::cout << "before local = " << example::format_list(local) << std::endl;

    chorus::allgather(tp, local, gathered);

    std::cout << "after gathered = " << example::format_list(gathered) << std::endl;
    std::vector<float> expected(world);
    for (std::size_t i = 0; i < world; ++i) expected[i] = static_cast<float>(i);
    return example::check("allgather", tp.rank(), gathered, expected) ? 0 : 1;
}

} // namespace

int main() { return example::run_rank([](auto& tp) { return run(tp); }); }
