// SPDX-License-Identifier: MIT
// allreduce: data-parallel gradient sync. Rank r holds the "gradient" [r + 1]; chorus::allreduce
// with SUM gives every rank the total 1 + 2 + ... + p, and with AVG the mean (p + 1) / 2, the
// average gradient that every replica then applies. Works for any number of ranks.
//
// Usage: chorusrun -n 4 build/examples/all_reduce
//
// Expected output (lines of different ranks may interleave):
//   [rank0] before grad = [1.0]
//   [rank1] before grad = [2.0]
//   [rank2] before grad = [3.0]
//   [rank3] before grad = [4.0]
//   [rank0] SUM = [10.0]  AVG (gradient sync) = [2.5]
//   [rank1] SUM = [10.0]  AVG (gradient sync) = [2.5]
//   [rank2] SUM = [10.0]  AVG (gradient sync) = [2.5]
//   [rank3] SUM = [10.0]  AVG (gradient sync) = [2.5]

#include "example_util.hpp"
#include <iostream>
#include <vector>

#include <chorus/chorus.hpp>
#include <chorus/transport/tcp.hpp>

namespace {

int run(auto& tp) {
    auto const world = static_cast<float>(tp.size());
    std::vector<float> const grad{static_cast<float>(tp.rank() + 1)};
    std::cout << "before grad = " << example::format_list(grad) << std::endl;

    // allreduce works in place, so each reduction gets its own copy of the gradient.
    std::vector<float> total = grad;
    chorus::allreduce(tp, total, chorus::sum{});
    // The seed sums and divides by the world size because NCCL's AVG depends on the version;
    // chorus::avg does exactly that (a sum, then one division by the rank count).
    std::vector<float> mean = grad;
    chorus::allreduce(tp, mean, chorus::avg{});

    std::cout << "SUM = " << example::format_list(total) << "  AVG (gradient sync) = " << example::format_list(mean)
              << std::endl;

    // 1 + 2 + ... + p, and its mean; exact in float for any realistic p.
    float const expected_sum = world * (world + 1.0f) / 2.0f;
    float const expected_avg = (world + 1.0f) / 2.0f;
    if (total[0] != expected_sum || mean[0] != expected_avg) {
        std::cerr << "allreduce: rank " << tp.rank() << " got SUM " << example::format_value(total[0]) << ", AVG "
                  << example::format_value(mean[0]) << "; expected " << example::format_value(expected_sum) << ", "
                  << example::format_value(expected_avg) << std::endl;
        return 1;
    }
    return 0;
}

} // namespace

int main() { return example::run_rank([](auto& tp) { return run(tp); }); }
