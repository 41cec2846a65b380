// SPDX-License-Identifier: MIT
// broadcast: rank 0 (the root) holds [1, 2, 3], every other rank zeros; after
// chorus::broadcast every rank holds the root's [1, 2, 3]. Works for any number of ranks.
//
// Usage: chorusrun -n 4 build/examples/broadcast
//
// Expected output (lines of different ranks may interleave):
//   [rank0] before = [1.0, 2.0, 3.0]
//   [rank1] before = [0.0, 0.0, 0.0]
//   [rank2] before = [0.0, 0.0, 0.0]
//   [rank3] before = [0.0, 0.0, 0.0]
//   [rank0] after = [1.0, 2.0, 3.0]
//   [rank1] after = [1.0, 2.0, 3.0]
//   [rank2] after = [1.0, 2.0, 3.0]
//   [rank3] after = [1.0, 2.0, 3.0]

#include "example_util.hpp"
#include <iostream>
#include <vector>

#include <chorus/chorus.hpp>
#include <chorus/transport/tcp.hpp>

namespace {

int run(auto& tp) {
    std::vector<float> const root_data{1.0f, 2.0f, 3.0f};
    // The root has the data; the others only a buffer of the right size to be filled.
    std::vector<float> tensor = tp.rank() == 0 ? root_data : std::vector<float>(root_data.size(), 0.0f);
    std::cout << "before = " << example::format_list(tensor) << std::endl;

    chorus::broadcast(tp, tensor, /*root=*/0);

    std::cout << "after = " << example::format_list(tensor) << std::endl;
    return example::check("broadcast", tp.rank(), tensor, root_data) ? 0 : 1;
}

} // namespace

int main() { return example::run_rank([](auto& tp) { return run(tp); }); }
