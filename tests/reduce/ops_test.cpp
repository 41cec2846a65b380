// SPDX-License-Identifier: MIT
// The reduce_op concepts and the built-in ops on every arithmetic type, alone and through
// allreduce; host_memory's copies.

#include <doctest/doctest.h>

#include <chorus/chorus.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <span>
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

// host_memory::copy streams large copies past the cache (detail::copy_bytes from a threshold,
// detail::streaming_copy): a head by memcpy up to the destination's 64-byte boundary, whole
// lines, a tail. Every split of that must give memcpy's bytes and touch nothing around the
// destination; the offsets are from a 64-byte boundary, so the aligned case (no head) runs too.
TEST_CASE("host memory: streaming copies equal memcpy at every alignment and length, and touch nothing else") {
    std::size_t const lengths[] = {0, 1, 15, 16, 63, 64, 65, 127, 128, 129, 1000, 4096 + 17, (std::size_t{1} << 20) + 3};
    std::size_t const dst_offsets[] = {0, 1, 7, 16, 33, 63};
    std::size_t const src_offsets[] = {0, 5, 64};
    std::size_t const big = (std::size_t{1} << 20) + 256;
    std::vector<unsigned char> src(big), dst_storage(big + 256);
    auto* const base = reinterpret_cast<unsigned char*>(
        (reinterpret_cast<std::uintptr_t>(dst_storage.data()) + 127) & ~std::uintptr_t{63});  // 64 guard bytes before
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + (i >> 8) * 7 + 1);
    for (std::size_t n : lengths) {
        for (std::size_t d_off : dst_offsets) {
            for (std::size_t s_off : src_offsets) {
                CAPTURE(n);
                CAPTURE(d_off);
                CAPTURE(s_off);
                unsigned char* const from = base - 64;  // the guards: 64 bytes either side
                std::size_t const window = 64 + d_off + n + 64;
                std::fill(from, from + window, static_cast<unsigned char>(0xEE));
                // Threshold 1: every non-empty copy streams; streaming_copy itself takes n == 0.
                if (n == 0) chorus::detail::streaming_copy(base + d_off, src.data() + s_off, n);
                else chorus::detail::copy_bytes(base + d_off, src.data() + s_off, n, 1);
                std::size_t bad = 0;
                for (std::size_t i = 0; i < window; ++i) {
                    bool const inside = i >= 64 + d_off && i < 64 + d_off + n;
                    unsigned char const want = inside ? src[s_off + (i - 64 - d_off)] : static_cast<unsigned char>(0xEE);
                    bad += from[i] != want;
                }
                CHECK(bad == 0);
            }
        }
    }
    // Through host_memory::copy (the process's threshold): the same bytes, and 0 elements with no buffer.
    std::vector<float> a(3000), b(3000, -1.0f);
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) * 0.5f;
    chorus::host_memory::copy(std::span<float>(b), std::span<float const>(a));
    CHECK(a == b);
    chorus::host_memory::copy(std::span<float>(), std::span<float const>());
    chorus::detail::copy_bytes(nullptr, nullptr, 0, 1);
    // Through copy_part: a small block of a buffer past any threshold streams (odd length and
    // offset: head, body and tail), and an empty one is a no-op.
    std::vector<float> c(3000, -1.0f);
    chorus::host_memory::copy_part(std::span<float>(c).subspan(1, 2997), std::span<float const>(a).subspan(1, 2997), std::size_t{1} << 40);
    CHECK(c.front() == -1.0f);
    CHECK(c.back() == -1.0f);
    CHECK(std::equal(c.begin() + 1, c.end() - 2, a.begin() + 1));
    chorus::host_memory::copy_part(std::span<float>(), std::span<float const>(), std::size_t{1} << 40);
}

TEST_CASE("CHORUS_NT_COPY_BYTES: 64 MiB by default, 0 never streams, a bad value names its reader") {
    chorus::detail::env_reader const env("reader");
    ::unsetenv("CHORUS_NT_COPY_BYTES");
    CHECK(chorus::detail::nt_copy_bytes_from(env) == std::size_t{64} << 20);
    ::setenv("CHORUS_NT_COPY_BYTES", "4096", 1);
    CHECK(chorus::detail::nt_copy_bytes_from(env) == 4096);
    ::setenv("CHORUS_NT_COPY_BYTES", "0", 1);
    CHECK(chorus::detail::nt_copy_bytes_from(env) == static_cast<std::size_t>(-1));
    ::setenv("CHORUS_NT_COPY_BYTES", "lots", 1);
    CHECK_THROWS_WITH_AS(chorus::detail::nt_copy_bytes_from(env), doctest::Contains("reader: CHORUS_NT_COPY_BYTES is not a number: 'lots'"),
                         chorus::invalid_argument);
    ::unsetenv("CHORUS_NT_COPY_BYTES");
}
