// SPDX-License-Identifier: MIT
// A consumer of chorus as a downstream project would write it: only the umbrella header
// and the public API. 4 ranks each contribute rank+1, so the sum is 1+2+3+4 = 10.
#include <cstdio>
#include <stdexcept>
#include <vector>

#include <chorus/chorus.hpp>

int main() {
    chorus::run_ranks(4, [](auto& tp) {
        std::vector<float> v{float(tp.rank() + 1)};
        chorus::allreduce(tp, v, chorus::sum{});
        if (v[0] != 10.f) throw std::runtime_error("wrong");
    });
    std::puts("ok");
    return 0;
}
