// SPDX-License-Identifier: MIT
// The reduce_op concepts and the built-in ops on every arithmetic type, alone and through
// allreduce.

#include <doctest/doctest.h>

#include <chorus/chorus.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "../support/archetypes.hpp"
#include "../support/oracle.hpp"

using chorus::rank_t;

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

// The arithmetic ops are constrained: over a type without the operator they are no reduce_op,
// so a front door rejects them at the call (tests/compile_fail: OP_WITHOUT_PLUS).
struct no_arithmetic {
    int x;
};
static_assert(!chorus::reduce_op<chorus::sum, no_arithmetic> && !chorus::reduce_op<chorus::avg, no_arithmetic>);
static_assert(!chorus::reduce_op<chorus::prod, no_arithmetic> && !chorus::reduce_op<chorus::minimum, no_arithmetic>);
static_assert(!chorus::reduce_op<chorus::maximum, no_arithmetic>);

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
