// SPDX-License-Identifier: MIT
// The reduce operations the seed names besides SUM and AVG: MAX, MIN and PROD. Rank r holds a
// loss, a learning-rate scale and a step count; allreduce with MAX finds the worst loss (for
// early stopping), MIN the smallest scale (every replica must apply the same), PROD the product
// of per-rank scale factors, and reduce with MAX at rank 0 the slowest rank's step count.
// Works for any number of ranks; the values below are for 4.
//
// Usage: chorusrun -n 4 build/examples/reduce_ops
//
// Expected output (lines of different ranks may interleave):
//   [rank0] loss = [1.5]  scale = [1.0]  steps = [100]
//   [rank1] loss = [0.5]  scale = [2.0]  steps = [101]
//   [rank2] loss = [2.5]  scale = [3.0]  steps = [102]
//   [rank3] loss = [1.0]  scale = [4.0]  steps = [103]
//   [rank0] MAX loss = [2.5]  MIN scale = [1.0]  PROD scale = [24.0]
//   [rank1] MAX loss = [2.5]  MIN scale = [1.0]  PROD scale = [24.0]
//   [rank2] MAX loss = [2.5]  MIN scale = [1.0]  PROD scale = [24.0]
//   [rank3] MAX loss = [2.5]  MIN scale = [1.0]  PROD scale = [24.0]
//   [rank0] slowest rank's steps (MAX at rank 0) = [103]

#include "example_util.hpp"
#include <iostream>
#include <vector>

#include <chorus/chorus.hpp>
#include <chorus/transport/tcp.hpp>

namespace {

int run(auto& tp) {
    int const r = tp.rank(), p = tp.size();
    double const losses[] = {1.5, 0.5, 2.5, 1.0};
    std::vector<double> const loss{losses[r % 4]};
    std::vector<float> const scale{static_cast<float>(r + 1)};
    std::vector<int> steps{100 + r};
    std::cout << "loss = " << example::format_list(loss) << "  scale = " << example::format_list(scale)
              << "  steps = " << example::format_list(steps) << std::endl;

    std::vector<double> worst = loss;
    chorus::allreduce(tp, worst, chorus::maximum{});
    std::vector<float> smallest = scale, product = scale;
    chorus::allreduce(tp, smallest, chorus::minimum{});
    chorus::allreduce(tp, product, chorus::prod{});
    std::cout << "MAX loss = " << example::format_list(worst) << "  MIN scale = " << example::format_list(smallest)
              << "  PROD scale = " << example::format_list(product) << std::endl;
    chorus::reduce(tp, steps, chorus::maximum{}, 0);  // in place: the result at the root only
    if (r == 0) std::cout << "slowest rank's steps (MAX at rank 0) = " << example::format_list(steps) << std::endl;

    // The closed forms, for any p.
    double want_worst = 0;
    float want_product = 1;
    for (int k = 0; k < p; ++k) {
        want_worst = std::max(want_worst, losses[k % 4]);
        want_product *= static_cast<float>(k + 1);
    }
    bool ok = example::check("MAX", r, worst, std::vector<double>{want_worst});
    ok = example::check("MIN", r, smallest, std::vector<float>{1.0f}) && ok;
    ok = example::check("PROD", r, product, std::vector<float>{want_product}) && ok;
    if (r == 0) ok = example::check("reduce MAX", r, steps, std::vector<int>{100 + p - 1}) && ok;
    return ok ? 0 : 1;
}

} // namespace

int main() { return example::run_rank([](auto& tp) { return run(tp); }); }
