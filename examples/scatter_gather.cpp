// SPDX-License-Identifier: MIT
// scatter / gather: the root (rank 0) holds one value per rank, [10, 11, 12, 13], and
// chorus::scatter hands value i to rank i; then every rank sends its own rank number and
// chorus::gather collects them, in rank order, at the root only. Works for any number of ranks.
//
// Usage: chorusrun -n 4 build/examples/scatter_gather
//
// Expected output (lines of different ranks may interleave):
//   [rank0] after scatter received = [10.0]
//   [rank1] after scatter received = [11.0]
//   [rank2] after scatter received = [12.0]
//   [rank3] after scatter received = [13.0]
//   [rank0] gather collected = [[0.0], [1.0], [2.0], [3.0]]

#include "example_util.hpp"
#include <cstddef>
#include <iostream>
#include <string>
#include <vector>

#include <chorus/chorus.hpp>
#include <chorus/transport/tcp.hpp>

namespace {

constexpr chorus::rank_t root = 0;

int run(auto& tp) {
    auto const world = static_cast<std::size_t>(tp.size());
    bool ok = true;

    // Scatter: only the root's send buffer is read, so the others pass an empty one.
    std::vector<float> scatter_list;
    if (tp.rank() == root)
        for (std::size_t i = 0; i < world; ++i) scatter_list.push_back(10.0f + static_cast<float>(i));
    std::vector<float> received(1, 0.0f);
    chorus::scatter(tp, scatter_list, received, root);
    std::cout << "after scatter received = " << example::format_list(received) << std::endl;
    if (float const expected = 10.0f + static_cast<float>(tp.rank()); received[0] != expected) {
        std::cerr << "scatter: rank " << tp.rank() << " received " << example::format_value(received[0])
                  << ", expected " << example::format_value(expected) << std::endl;
        ok = false;
    }

    // Gather: every rank sends its number; only the root needs (and gets) a receive buffer.
    std::vector<float> const mine{static_cast<float>(tp.rank())};
    std::vector<float> gathered(tp.rank() == root ? world : 0);
    chorus::gather(tp, mine, gathered, root);
    if (tp.rank() == root) {
        // One [x] per rank, as the seed prints its list of one-element tensors.
        std::string text = "[";
        for (std::size_t i = 0; i < world; ++i) text += (i ? ", [" : "[") + example::format_value(gathered[i]) + "]";
        std::cout << "gather collected = " << text << "]" << std::endl;
        for (std::size_t i = 0; i < world; ++i) {
            if (gathered[i] != static_cast<float>(i)) {
                std::cerr << "gather: slot " << i << " holds " << example::format_value(gathered[i]) << ", expected "
                          << i << std::endl;
                ok = false;
            }
        }
    }
    return ok ? 0 : 1;
}

} // namespace

int main() { return example::run_rank([](auto& tp) { return run(tp); }); }
