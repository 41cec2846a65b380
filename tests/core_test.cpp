// SPDX-License-Identifier: MIT
// Concepts (archetypes and non-models), reduce ops on every arithmetic type, topologies,
// and the transport conformance suite on loopback_transport.

#include <doctest/doctest.h>

#include <chorus/chorus.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <queue>
#include <set>
#include <span>
#include <vector>

#include <range/v3/view/iota.hpp>
#include <range/v3/view/transform.hpp>
#include <range/v3/numeric/accumulate.hpp>

#include "support/archetypes.hpp"
#include "support/conformance.hpp"
#include "support/oracle.hpp"

using chorus::rank_t;

// ---- concepts ---------------------------------------------------------------------------

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
static_assert(!chorus::transport<nonmodels::no_abort>);
static_assert(!chorus::transport<nonmodels::throwing_rank>);
static_assert(!chorus::transport<nonmodels::no_memory_space>);
static_assert(!chorus::request<nonmodels::copy_only_request>);

static_assert(chorus::reduce_op<archetypes::reduce_op, float>);
static_assert(!chorus::commutative_reduce_op<archetypes::reduce_op, float>);
static_assert(!chorus::reduce_op_with_identity<archetypes::reduce_op, float>);
static_assert(chorus::commutative_reduce_op<chorus::sum, int>);
static_assert(chorus::reduce_op_with_identity<chorus::maximum, double>);
static_assert(!chorus::reduce_op<chorus::bit_and, float>);  // bitwise ops are for integers
static_assert(!chorus::reduce_op<int, float>);
inline constexpr auto returns_void = [](int, int) {};
static_assert(!chorus::reduce_op<decltype(returns_void), int>);
inline constexpr auto concat = [](int a, int b) { return a * 10 + b; };
static_assert(chorus::reduce_op<decltype(concat), int> && !chorus::commutative_reduce_op<decltype(concat), int>);
static_assert(chorus::commutative_reduce_op<decltype(chorus::commutative(concat)), int>);

static_assert(chorus::topology<archetypes::topology> && !chorus::tree_topology<archetypes::topology>);
static_assert(chorus::tree_topology<archetypes::tree_topology>);
static_assert(chorus::tree_topology<chorus::binomial_tree> && chorus::tree_topology<chorus::binary_tree>);
static_assert(chorus::topology<chorus::ring_topology> && chorus::topology<chorus::hypercube>);
static_assert(!chorus::tree_topology<chorus::ring_topology>);
static_assert(!chorus::topology<int>);

// Every algorithm instantiates over the archetypes: they use nothing the concepts lack.
template <class... Fns>
constexpr bool instantiated(Fns...) { return true; }
using arch = archetypes::transport;
using aop = archetypes::reduce_op;
using csum = chorus::sum;
static_assert(instantiated(&chorus::dissemination_barrier<arch>, &chorus::linear_broadcast<arch, float>,
                           static_cast<void (*)(arch&, std::span<float>, rank_t)>(&chorus::tree_broadcast<arch, float>),
                           &chorus::tree_broadcast<arch, archetypes::tree_topology, float>,
                           &chorus::linear_scatter<arch, float>, &chorus::linear_gather<arch, float>,
                           &chorus::ring_allgather<arch, float>,
                           static_cast<void (*)(arch&, std::span<float const>, std::span<float>, aop, rank_t)>(
                               &chorus::tree_reduce<arch, float, aop>),
                           &chorus::tree_allreduce<arch, float, aop>, &chorus::recursive_doubling_allreduce<arch, float, aop>,
                           &chorus::rabenseifner_allreduce<arch, float, aop>, &chorus::ring_allreduce<arch, float, csum>,
                           &chorus::ring_reduce_scatter<arch, float, csum>, &chorus::tree_reduce_scatter<arch, float, aop>,
                           &chorus::pairwise_alltoall<arch, float>,
                           static_cast<void (*)(arch&, std::span<float const>, std::vector<int> const&, std::span<float>,
                                                std::vector<int> const&)>(
                               &chorus::pairwise_alltoallv<arch, float, std::vector<int>, std::vector<int>>)));

// ---- reduce ops -------------------------------------------------------------------------

TEST_CASE_TEMPLATE("reduce ops: identities and results on every arithmetic type", T, std::int8_t, std::uint8_t, std::int16_t,
                   std::uint16_t, std::int32_t, std::uint32_t, std::int64_t, std::uint64_t, float, double) {
    std::array<T, 5> const samples{T{0}, T{1}, T{3}, std::numeric_limits<T>::max(), std::numeric_limits<T>::lowest()};
    auto check_identity = [&](auto op) {
        for (T x : samples) {
            CHECK(op(chorus::identity_element<T>(op), x) == x);
            CHECK(op(x, chorus::identity_element<T>(op)) == x);
        }
    };
    check_identity(chorus::sum{});
    check_identity(chorus::prod{});
    check_identity(chorus::minimum{});
    check_identity(chorus::maximum{});
    CHECK(chorus::sum{}(T{2}, T{3}) == T{5});
    CHECK(chorus::prod{}(T{2}, T{3}) == T{6});
    CHECK(chorus::minimum{}(T{2}, T{3}) == T{2});
    CHECK(chorus::maximum{}(T{2}, T{3}) == T{3});
    CHECK(chorus::avg{}.finalize(T{7}, 2) == static_cast<T>(T{7} / T{2}));
    static_assert(chorus::is_commutative_v<chorus::sum, T> && chorus::is_commutative_v<chorus::avg, T>);
    if constexpr (std::is_integral_v<T>) {
        check_identity(chorus::bit_and{});
        check_identity(chorus::bit_or{});
        check_identity(chorus::bit_xor{});
        CHECK(chorus::bit_and{}(T{6}, T{3}) == T{2});
        CHECK(chorus::bit_or{}(T{6}, T{3}) == T{7});
        CHECK(chorus::bit_xor{}(T{6}, T{3}) == T{5});
        CHECK(chorus::identity_element<T>(chorus::minimum{}) == std::numeric_limits<T>::max());
        CHECK(chorus::identity_element<T>(chorus::maximum{}) == std::numeric_limits<T>::lowest());
    } else {
        // -0.0 keeps the sign of a sum of negative zeros; +-inf are the true min/max identities.
        CHECK(std::signbit(chorus::identity_element<T>(chorus::sum{})));
        CHECK(chorus::sum{}(chorus::identity_element<T>(chorus::sum{}), T(-0.0)) == T(0));
        CHECK(std::signbit(chorus::sum{}(chorus::identity_element<T>(chorus::sum{}), T(-0.0))));
        CHECK(chorus::identity_element<T>(chorus::minimum{}) == std::numeric_limits<T>::infinity());
        CHECK(chorus::identity_element<T>(chorus::maximum{}) == -std::numeric_limits<T>::infinity());
    }
}

TEST_CASE("avg over integers truncates toward zero, as documented") {
    CHECK(chorus::avg{}.finalize(7, 2) == 3);
    CHECK(chorus::avg{}.finalize(-7, 2) == -3);
    CHECK(chorus::avg{}.finalize(10.0, 4) == 2.5);
    // The rank count need not fit in the element type.
    CHECK(chorus::avg{}.finalize(std::uint8_t{200}, 256) == 0);
    CHECK(chorus::avg{}.finalize(std::int8_t{-100}, 128) == 0);
    CHECK(chorus::avg{}.finalize(std::int8_t{100}, 50) == 2);
}

TEST_CASE_TEMPLATE("allreduce runs every op on every arithmetic type", T, std::int8_t, std::uint8_t, std::int16_t,
                   std::uint16_t, std::int64_t, std::uint64_t, std::uint32_t) {
    for (rank_t p : {1, 3, 4, 8}) {
        oracle::failures f;
        chorus::run_ranks(p, [&](auto& tp) {
            oracle::for_each_op<T>([&](oracle::op_kind k, auto op) {
                for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t(p + 1), std::size_t{257}}) {
                    std::vector<T> v(n);
                    for (std::size_t i = 0; i < n; ++i) v[i] = oracle::value<T>(k, tp.rank(), i);
                    chorus::allreduce(tp, v, op);
                    oracle::compare(f, std::string("allreduce ") + oracle::name(k) + " n=" + std::to_string(n), v,
                                    [&](std::size_t i) { return oracle::expected<T>(k, p, i); });
                }
            });
        });
        CHECK_MESSAGE(f.count() == 0, "p = " << p << "\n" << f.report());
    }
}

// ---- topologies -------------------------------------------------------------------------

template <class Tree>
void check_spanning_tree(Tree const& tree, int max_depth) {
    rank_t const p = tree.size();
    CHECK(tree.parents(tree.root()).empty());
    std::vector<int> depth(static_cast<std::size_t>(p), -1);
    std::queue<rank_t> todo;
    depth[static_cast<std::size_t>(tree.root())] = 0;
    todo.push(tree.root());
    while (!todo.empty()) {
        rank_t const r = todo.front();
        todo.pop();
        for (rank_t c : tree.children(r)) {
            REQUIRE(c >= 0);
            REQUIRE(c < p);
            REQUIRE(depth[static_cast<std::size_t>(c)] == -1);  // no rank is reached twice
            auto const parents = tree.parents(c);
            REQUIRE(parents.size() == 1);
            CHECK(parents[0] == r);
            depth[static_cast<std::size_t>(c)] = depth[static_cast<std::size_t>(r)] + 1;
            todo.push(c);
        }
    }
    for (rank_t r = 0; r < p; ++r) {
        CHECK(depth[static_cast<std::size_t>(r)] >= 0);  // every rank is reached
        CHECK(depth[static_cast<std::size_t>(r)] <= max_depth);
    }
}

int ceil_log2(rank_t p) {
    int d = 0;
    while ((rank_t{1} << d) < p) ++d;
    return d;
}

TEST_CASE("binomial and binary trees span every rank count and root within their depth") {
    for (rank_t p = 1; p <= 33; ++p)
        for (rank_t root = 0; root < p; ++root) {
            CAPTURE(p);
            CAPTURE(root);
            check_spanning_tree(chorus::binomial_tree(p, root), ceil_log2(p));
            check_spanning_tree(chorus::binary_tree(p, root), ceil_log2(p + 1));
        }
}

TEST_CASE("binomial tree rooted at 0: children's subtrees are consecutive rank intervals") {
    for (rank_t p = 1; p <= 33; ++p) {
        chorus::binomial_tree const tree(p, 0);
        for (rank_t v = 0; v < p; ++v) {
            rank_t next = v + 1;  // own rank first, then each child's interval in order
            for (rank_t c : tree.children(v)) {
                CHECK(c == next);
                next += tree.subtree_size(c);
            }
            CHECK(next == v + tree.subtree_size(v));
        }
    }
}

TEST_CASE("hypercube: fold, core ranks and partners for every rank count") {
    for (rank_t p = 1; p <= 40; ++p) {
        chorus::hypercube const cube(p);
        rank_t const q = cube.core_size();
        CHECK((q & (q - 1)) == 0);
        CHECK(q <= p);
        CHECK(p < 2 * q);
        CHECK((rank_t{1} << cube.dimension()) == q);
        std::set<rank_t> cores;
        rank_t previous = -1;
        for (rank_t r = 0; r < p; ++r) {
            if (cube.is_folded(r)) {
                CHECK(cube.core_rank(r) == -1);
                CHECK(cube.fold_partner(cube.fold_partner(r)) == r);
                continue;
            }
            rank_t const c = cube.core_rank(r);
            CHECK(c > previous);  // monotone: rank order survives the fold
            previous = c;
            cores.insert(c);
            CHECK(cube.real_rank(c) == r);
            for (int s = 0; s < cube.dimension(); ++s) CHECK(cube.partner(cube.partner(r, s), s) == r);
        }
        CHECK(static_cast<rank_t>(cores.size()) == q);
    }
}

TEST_CASE("ring topology neighbours") {
    chorus::ring_topology const ring(5);
    CHECK(ring.right(4) == 0);
    CHECK(ring.left(0) == 4);
    CHECK(ring.neighbours(2).size() == 2);
    CHECK(chorus::ring_topology(2).neighbours(0).size() == 1);
    CHECK(chorus::ring_topology(1).neighbours(0).empty());
}

// ---- transports -------------------------------------------------------------------------

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
