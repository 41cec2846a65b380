// SPDX-License-Identifier: MIT
// The transport concept (archetypes and non-models) and loopback_transport: the conformance
// suite, run_ranks, and the point-to-point front doors over it.

#include <doctest/doctest.h>

#include <chorus/chorus.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <vector>

#include <range/v3/numeric/accumulate.hpp>
#include <range/v3/view/iota.hpp>
#include <range/v3/view/transform.hpp>

#include "../support/archetypes.hpp"
#include "../support/conformance.hpp"

using chorus::rank_t;

// ---- the concept -------------------------------------------------------------------------

static_assert(chorus::transport<archetypes::transport>);
static_assert(chorus::transport<chorus::loopback_transport>);
static_assert(chorus::host_transport<chorus::loopback_transport>);
static_assert(chorus::request<chorus::loopback_transport::request>);
static_assert(!chorus::transport<int>);

namespace nonmodels {
struct no_abort {  // everything but abort()
    using memory_space = chorus::host_memory;
    using request = archetypes::request;
    rank_t rank() const noexcept;
    rank_t size() const noexcept;
    request isend(rank_t, chorus::tag_t, std::span<std::byte const>);
    request irecv(rank_t, chorus::tag_t, std::span<std::byte>);
    std::uint64_t next_sequence();
};
struct throwing_rank : archetypes::transport {
    rank_t rank() const;  // may throw: not a model
};
struct no_memory_space {
    using request = archetypes::request;
    rank_t rank() const noexcept;
    rank_t size() const noexcept;
    request isend(rank_t, chorus::tag_t, std::span<std::byte const>);
    request irecv(rank_t, chorus::tag_t, std::span<std::byte>);
    std::uint64_t next_sequence();
    void abort(char const*) noexcept;
};
struct copy_only_request {
    void wait();
};
} // namespace nonmodels
struct bad_memory_space : archetypes::transport {  // a memory space without buffers or copies
    using memory_space = int;
};
static_assert(!chorus::transport<nonmodels::no_abort>);
static_assert(!chorus::transport<nonmodels::throwing_rank>);
static_assert(!chorus::transport<nonmodels::no_memory_space>);
static_assert(!chorus::request<nonmodels::copy_only_request>);
static_assert(!chorus::transport<bad_memory_space>);
static_assert(chorus::memory_space<chorus::host_memory> && !chorus::memory_space<int>);

// ---- loopback ----------------------------------------------------------------------------

struct loopback_runner {
    template <class Fn>
    static void run(rank_t p, Fn&& fn, std::chrono::milliseconds timeout) {
        chorus::run_ranks(p, std::forward<Fn>(fn), {.timeout = timeout});
    }
};
TEST_CASE_TEMPLATE_INVOKE(transport_conformance, loopback_runner);

TEST_CASE("run_ranks rethrows the first failure and the other ranks are released") {
    auto const start = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH_AS(chorus::run_ranks(4, [](auto& tp) {
        if (tp.rank() == 2) throw std::runtime_error("rank 2 broke");
        chorus::barrier(tp);  // would wait 30 s for rank 2 without the abort
    }), "rank 2 broke", std::runtime_error);
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
    CHECK_THROWS_AS(chorus::loopback_group(0), chorus::invalid_argument);
}

TEST_CASE("point-to-point front doors take contiguous ranges, including range-v3 views") {
    chorus::run_ranks(2, [](auto& tp) {
        rank_t const other = 1 - tp.rank();
        std::array<double, 3> out{1.5, 2.5, 3.5};
        std::vector<double> in(3);
        chorus::sendrecv(tp, other, out, other, in, 11);
        CHECK(in == std::vector<double>{1.5, 2.5, 3.5});
        // A range-v3 computed view is not contiguous: materialise it, then send.
        auto const squares = ranges::views::iota(0, 4) | ranges::views::transform([](int i) { return i * i; });
        std::vector<int> sq(squares.begin(), squares.end());
        std::vector<int> got(4);
        auto r = chorus::irecv(tp, other, got);
        auto s = chorus::isend(tp, other, sq);
        s.wait();
        r.wait();
        CHECK(ranges::accumulate(got, 0) == 0 + 1 + 4 + 9);
    });
}
