// SPDX-License-Identifier: MIT
// Every collective x every algorithm x ranks {1,2,3,4,5,7,8} x sizes {0, 1, p-1, p+1, 4099}
// x every op x int/float/double, checked against the closed forms of support/oracle.hpp.
// The checks live in support/collective_matrix.hpp (shared with the multi-process tests);
// one run_ranks per (collective, rank count): the ranks then run the whole case list in the
// same order, which also exercises the collective tag sequence.

#include "support/collective_matrix.hpp"
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include <chorus/chorus.hpp>

using namespace oracle;
using chorus::rank_t;

namespace {

// Runs `body(tp, failures)` on every rank count and fails the test case with the report.
template <class Body>
void on_all_rank_counts(Body body) {
    for (rank_t p : rank_counts) {
        failures f;
        chorus::run_ranks(p, [&](auto& tp) { body(tp, f); });
        INFO("p = " << p);
        CHECK_MESSAGE(f.count() == 0, f.report());
    }
}

}  // namespace

TEST_CASE("allreduce: every algorithm, op, type and size against the oracle") {
    on_all_rank_counts([](auto& tp, failures& f) { checks::allreduce(tp, f); });
}

TEST_CASE("allreduce: a non-commutative op keeps rank order in every order-preserving algorithm") {
    on_all_rank_counts([](auto& tp, failures& f) { checks::allreduce_noncommutative(tp, f); });
}

TEST_CASE("allreduce: a user lambda marked commutative runs on the ring") {
    on_all_rank_counts([](auto& tp, failures& f) { checks::allreduce_user_commutative(tp, f); });
}

TEST_CASE("reduce: every root, op, type and size, in place and into a separate buffer") {
    on_all_rank_counts([](auto& tp, failures& f) { checks::reduce(tp, f); });
}

TEST_CASE("reduce_scatter: ring and tree, every op, type and size") {
    on_all_rank_counts([](auto& tp, failures& f) { checks::reduce_scatter(tp, f); });
}

TEST_CASE("broadcast: tree and linear, every root, type and size") {
    on_all_rank_counts([](auto& tp, failures& f) { checks::broadcast(tp, f); });
}

TEST_CASE("scatter and gather: every root, type and size") {
    on_all_rank_counts([](auto& tp, failures& f) { checks::scatter_gather(tp, f); });
}

TEST_CASE("allgather: every type and size") {
    on_all_rank_counts([](auto& tp, failures& f) { checks::allgather(tp, f); });
}

TEST_CASE("alltoall: the transpose, every type and size") {
    on_all_rank_counts([](auto& tp, failures& f) { checks::alltoall(tp, f); });
}

TEST_CASE("alltoallv: skewed counts with zero blocks, packed and with explicit displacements") {
    on_all_rank_counts([](auto& tp, failures& f) { checks::alltoallv(tp, f); });
}

TEST_CASE("barrier: no rank leaves before every rank arrived") {
    for (rank_t p : rank_counts) {
        std::atomic<int> arrived{0};
        std::atomic<int> early{0};
        chorus::run_ranks(p, [&](auto& tp) {
            for (int round = 1; round <= 5; ++round) {
                // Stagger arrivals so that a barrier releasing early would be seen.
                std::this_thread::sleep_for(std::chrono::microseconds(200 * ((tp.rank() + round) % 3)));
                arrived.fetch_add(1);
                chorus::barrier(tp);
                if (arrived.load() < round * p) early.fetch_add(1);
                chorus::barrier<chorus::dissemination>(tp);  // keep rounds apart
            }
        });
        CHECK_MESSAGE(early.load() == 0, "p = " << p);
    }
}
