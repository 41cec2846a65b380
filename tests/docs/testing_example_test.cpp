// SPDX-License-Identifier: MIT
// The example of docs/testing.md, word for word from its first include on: testing one's own
// collective code with doctest and chorus::run_ranks. It runs in the suite like any test.
#include <doctest/doctest.h>

#include <chorus/chorus.hpp>

#include <numeric>
#include <vector>

// The code under test: the mean of every rank's values, by one allreduce.
template <chorus::transport Transport>
double global_mean(Transport& tp, std::vector<double> const& mine) {
    std::vector<double> sum_count{std::accumulate(mine.begin(), mine.end(), 0.0), double(mine.size())};
    chorus::allreduce(tp, sum_count);
    return sum_count[1] == 0 ? 0.0 : sum_count[0] / sum_count[1];
}

TEST_CASE("global_mean over 1 to 8 ranks") {
    for (int p : {1, 2, 3, 4, 5, 7, 8}) {
        SUBCASE(("p = " + std::to_string(p)).c_str()) {
            chorus::run_ranks(p, [&](chorus::loopback_transport& tp) {
                // Rank r holds r + 1 copies of the value r: the mean is sum(r^2 + r) / sum(r + 1).
                std::vector<double> mine(std::size_t(tp.rank() + 1), double(tp.rank()));
                double num = 0, den = 0;
                for (int r = 0; r < p; ++r) {
                    num += double(r) * (r + 1);
                    den += r + 1;
                }
                INFO("rank " << tp.rank() << " of " << p);  // which rank failed, in the report
                CHECK(global_mean(tp, mine) == doctest::Approx(num / den));
            });
        }
    }
}

TEST_CASE("global_mean fails on every rank when one rank throws") {
    // A rank that throws aborts the group: the others' allreduce fails instead of hanging,
    // and run_ranks rethrows the first exception once every rank returned.
    CHECK_THROWS_AS(chorus::run_ranks(4,
                                      [](chorus::loopback_transport& tp) {
                                          if (tp.rank() == 2) throw std::runtime_error("rank 2 gives up");
                                          global_mean(tp, {1.0});
                                      }),
                    std::runtime_error);
}
