// SPDX-License-Identifier: MIT
// The reduce_op concepts and the built-in ops on every arithmetic type, alone and through
// allreduce; host_memory's copies.

#include <doctest/doctest.h>

#include <chorus/chorus.hpp>
#include <chorus/detail/elementwise.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <type_traits>
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

// ---- elementwise passes (the device kernels' and the signaled lanes' code, run here) ----------

namespace {
// Counts the loads of a pass, one by one and 16 bytes at a time.
struct counting_loads {
    std::size_t* single;
    std::size_t* wide;
    std::size_t* unaligned;  // wide loads off a 16-byte boundary
    template <class T>
    T load(T const* p) const {
        ++*single;
        return *p;
    }
    template <class T>
    chorus::detail::wide_vector<T> load_wide(T const* p) const {
        *unaligned += reinterpret_cast<std::uintptr_t>(p) % 16 != 0;
        ++*wide;
        return chorus::detail::plain_loads{}.load_wide(p);
    }
};
struct twelve_bytes {  // never widens: 12 does not divide 16
    std::int32_t a, b, c;
};
struct two_ints {  // 8 bytes aligned on 4: at an offset of 4 or 12 no vector can start
    std::int32_t a, b;
};
template <class T>
inline constexpr bool is_record_v = std::is_same_v<T, twelve_bytes> || std::is_same_v<T, two_ints>;
template <class T>
T element(std::size_t i, unsigned r) {
    if constexpr (std::is_same_v<T, twelve_bytes>) return {static_cast<std::int32_t>(i), static_cast<std::int32_t>(r), 1};
    else if constexpr (std::is_same_v<T, two_ints>) return {static_cast<std::int32_t>(i), static_cast<std::int32_t>(r)};
    else return static_cast<T>((i * 7 + r * 3) % 50);
}
template <class T>
T combine(T a, T b) {  // not commutative: the order of the operands shows
    if constexpr (std::is_same_v<T, twelve_bytes>) return {a.a * 2 + b.a, a.b * 2 + b.b, a.c + b.c};
    else if constexpr (std::is_same_v<T, two_ints>) return {a.a * 2 + b.a, a.b * 3 + b.b};
    else return static_cast<T>(a * 2 + b);
}
// Storage on 16-byte boundaries.
struct alignas(16) sixteen_bytes {
    unsigned char b[16];
};
template <class T>
bool same(T const& a, T const& b) {
    return std::memcmp(&a, &b, sizeof(T)) == 0;
}
} // namespace

// fold_elements: out[i] = finish(in(0)[i] step ... step in(count-1)[i]) over every thread of
// `threads`, at every offset of `out` and the operands from a 16-byte boundary, the operands
// lined up with `out` or one of them not, in place or not. Every element must be the closed
// form's, nothing around `out` written, and where everything lines up the middle must go 16
// bytes per load (one wide load per operand per vector; the rest one by one).
TEST_CASE_TEMPLATE("elementwise passes: every alignment, operand count and thread count; 16 bytes per load where they line up", T,
                   std::uint8_t, std::int16_t, float, double, twelve_bytes, two_ints) {
    namespace d = chorus::detail;
    constexpr bool widens = d::widens_v<T>;
    static_assert(widens == !std::is_same_v<T, twelve_bytes>);
    static_assert(sizeof(T) != 8 || alignof(T) == 8 || std::is_same_v<T, two_ints>);
    std::size_t const lengths[] = {0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 33, 100, 257};
    unsigned const counts[] = {1, 2, 3, 5};
    std::size_t const thread_counts[] = {1, 3, 32};
    std::size_t const max_n = 257, room = max_n + 64;
    // Storage on 16-byte boundaries: five operands and an output, each with room for an offset
    // of up to 16 bytes and a guard either side.
    std::vector<sixteen_bytes> storage(6 * (room * sizeof(T) / 16 + 4));
    auto* const base = reinterpret_cast<unsigned char*>(storage.data());
    auto const region = [&](unsigned k) { return base + 16 + k * (room * sizeof(T) / 16 + 4) * 16; };
    auto const finish = [](T x) {
        if constexpr (std::is_same_v<T, twelve_bytes>) return twelve_bytes{x.a, x.b, x.c + 100};
        else if constexpr (std::is_same_v<T, two_ints>) return two_ints{x.a + 100, x.b};
        else return static_cast<T>(x + 1);
    };
    for (bool in_place : {false, true}) {
        for (std::size_t off = 0; off < 16; off += alignof(T)) {
            for (bool misaligned_operand : {false, true}) {
                for (unsigned count : counts) {
                    for (std::size_t n : lengths) {
                        for (std::size_t threads : thread_counts) {
                            CAPTURE(in_place);
                            CAPTURE(off);
                            CAPTURE(misaligned_operand);
                            CAPTURE(count);
                            CAPTURE(n);
                            CAPTURE(threads);
                            if (in_place && misaligned_operand && count == 1) continue;  // `out` would overlap its operand
                            std::array<T*, 5> in{};
                            for (unsigned r = 0; r < count; ++r) {
                                // The last operand off by one alignment step (never `out` itself, in place).
                                std::size_t const shift = misaligned_operand && r == count - 1 ? alignof(T) : 0;
                                in[r] = reinterpret_cast<T*>(region(r) + off + shift);
                                for (std::size_t i = 0; i < n; ++i) in[r][i] = element<T>(i, r);
                            }
                            unsigned char* const out_bytes = in_place ? region(0) + off : region(5) + off;
                            auto* const out = reinterpret_cast<T*>(out_bytes);
                            std::vector<T> want(n);
                            for (std::size_t i = 0; i < n; ++i) {
                                T acc = element<T>(i, 0);
                                for (unsigned r = 1; r < count; ++r) acc = combine(acc, element<T>(i, r));
                                want[i] = finish(acc);
                            }
                            std::memset(out_bytes - 16, 0xEE, 16);
                            std::memset(out_bytes + n * sizeof(T), 0xEE, 16);
                            if (!in_place) std::memset(out_bytes, 0xEE, n * sizeof(T));
                            std::size_t single = 0, wide = 0, unaligned = 0;
                            auto const operand = [&](unsigned r) { return static_cast<T const*>(in[r]); };
                            for (std::size_t t = 0; t < threads; ++t)
                                d::fold_elements(out, operand, count, n, t, threads, [](T a, T b) { return combine(a, b); }, finish,
                                                 counting_loads{&single, &wide, &unaligned});
                            std::size_t bad = 0;
                            for (std::size_t i = 0; i < n; ++i) bad += !same(out[i], want[i]);
                            CHECK(bad == 0);
                            CHECK(std::count(out_bytes - 16, out_bytes, 0xEE) == 16);
                            CHECK(std::count(out_bytes + n * sizeof(T), out_bytes + n * sizeof(T) + 16, 0xEE) == 16);
                            // The loads: every operand of every element once, wide where they line up.
                            d::wide_split const s = d::split_wide(static_cast<T const*>(out), operand, count, n);
                            std::size_t const k = widens ? 16 / sizeof(T) : 1;
                            CHECK(unaligned == 0);
                            CHECK(single + wide * k == n * count);
                            CHECK(wide == s.wide * count);
                            CHECK(d::wide_items<T>(s, n) == (widens ? s.wide + n - s.wide * k : n));
                            // Lined up: every pointer at `off`, whole elements short of a boundary.
                            bool const lined_up = widens && !misaligned_operand && ((16 - off) % 16) % sizeof(T) == 0;
                            std::size_t const head = ((16 - off) % 16) / sizeof(T);
                            if (lined_up && n >= head) {
                                CHECK(s.head == head);
                                CHECK(s.wide == (n - head) / k);
                            }
                            if (!lined_up) CHECK(s.wide == 0);
                        }
                    }
                }
            }
        }
    }
}
