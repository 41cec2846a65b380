// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// The built-in reduce operations: SUM, PROD, MIN, MAX, AVG and bitwise AND/OR/XOR, plus
// `commutative(f)` to mark a user function as commutative.
//
// Named `minimum`/`maximum` (as CCCL does), not min/max: windows.h defines those as macros.

#include <concepts>
#include <type_traits>
#include <utility>

#include <chorus/config.hpp>
#include <chorus/detail/limits.hpp>
#include <chorus/fwd.hpp>

namespace chorus {

namespace detail {
// What the arithmetic ops need of T, so that an op over a type without it is no reduce_op
// and a front door says so at the call (collectives.hpp, reduce_op_for).
template <class T>
concept addable = requires(T const& a, T const& b) { static_cast<T>(a + b); };
template <class T>
concept multipliable = requires(T const& a, T const& b) { static_cast<T>(a * b); };
template <class T>
concept less_comparable = requires(T const& a, T const& b) {
    { b < a } -> std::convertible_to<bool>;
};
} // namespace detail

/// a + b. Identity -0.0 for floating point (so that a sum of -0.0 stays -0.0), 0 otherwise.
struct sum {
    template <class T>
        requires detail::addable<T>
    CHORUS_HOST_DEVICE constexpr T operator()(T const& a, T const& b) const noexcept {
        return static_cast<T>(a + b);
    }
};

/// a * b. Identity 1.
struct prod {
    template <class T>
        requires detail::multipliable<T>
    CHORUS_HOST_DEVICE constexpr T operator()(T const& a, T const& b) const noexcept {
        return static_cast<T>(a * b);
    }
};

/// The smaller of a and b (a when they compare equal). Identity +inf, or max() for integers.
struct minimum {
    template <class T>
        requires detail::less_comparable<T>
    CHORUS_HOST_DEVICE constexpr T operator()(T const& a, T const& b) const noexcept {
        return b < a ? b : a;
    }
};

/// The larger of a and b (a when they compare equal). Identity -inf, or lowest() for integers.
struct maximum {
    template <class T>
        requires detail::less_comparable<T>
    CHORUS_HOST_DEVICE constexpr T operator()(T const& a, T const& b) const noexcept {
        return a < b ? b : a;
    }
};

/// The mean over ranks: reduced as a sum, then divided by the rank count once at the end
/// (`finalize`). For integer types the sum is formed in `T` and divided with C++ integer
/// division, so the result truncates toward zero: the AVG of {1, 2} over int is 1. Use a
/// floating-point type (as the seed's 2.5 example does) for an exact mean.
struct avg {
    template <class T>
        requires detail::addable<T>
    CHORUS_HOST_DEVICE constexpr T operator()(T const& a, T const& b) const noexcept {
        return static_cast<T>(a + b);
    }
    template <class T>
    CHORUS_HOST_DEVICE constexpr T finalize(T const& total, rank_t ranks) const noexcept {
        if constexpr (std::is_integral_v<T>) {
            // Divide in a wide type: the rank count need not fit in T (256 ranks, uint8_t).
            using wide = std::conditional_t<std::is_signed_v<T>, long long, unsigned long long>;
            return static_cast<T>(static_cast<wide>(total) / static_cast<wide>(ranks));
        } else {
            return static_cast<T>(total / static_cast<T>(ranks));
        }
    }
};

/// a & b (integral types). Identity: all bits set.
struct bit_and {
    template <class T>
        requires std::is_integral_v<T>
    CHORUS_HOST_DEVICE constexpr T operator()(T const& a, T const& b) const noexcept {
        return static_cast<T>(a & b);
    }
};

/// a | b (integral types). Identity 0.
struct bit_or {
    template <class T>
        requires std::is_integral_v<T>
    CHORUS_HOST_DEVICE constexpr T operator()(T const& a, T const& b) const noexcept {
        return static_cast<T>(a | b);
    }
};

/// a ^ b (integral types). Identity 0.
struct bit_xor {
    template <class T>
        requires std::is_integral_v<T>
    CHORUS_HOST_DEVICE constexpr T operator()(T const& a, T const& b) const noexcept {
        return static_cast<T>(a ^ b);
    }
};

namespace detail {
template <class T>
inline constexpr bool is_number_v = std::is_arithmetic_v<T> && !std::is_same_v<T, bool>;
}

template <class T>
    requires detail::is_number_v<T>
struct reduce_traits<sum, T> {
    static constexpr bool is_commutative = true;
    CHORUS_HOST_DEVICE static constexpr T identity() noexcept {
        if constexpr (std::is_floating_point_v<T>) return -T{};
        else return T{};
    }
};

template <class T>
    requires detail::is_number_v<T>
struct reduce_traits<avg, T> : reduce_traits<sum, T> {};

template <class T>
    requires detail::is_number_v<T>
struct reduce_traits<prod, T> {
    static constexpr bool is_commutative = true;
    CHORUS_HOST_DEVICE static constexpr T identity() noexcept { return T{1}; }
};

template <class T>
    requires detail::is_number_v<T>
struct reduce_traits<minimum, T> {
    static constexpr bool is_commutative = true;
    CHORUS_HOST_DEVICE static constexpr T identity() noexcept {
        if constexpr (detail::numeric_limits<T>::has_infinity) return detail::numeric_limits<T>::infinity();
        else return detail::numeric_limits<T>::max();
    }
};

template <class T>
    requires detail::is_number_v<T>
struct reduce_traits<maximum, T> {
    static constexpr bool is_commutative = true;
    CHORUS_HOST_DEVICE static constexpr T identity() noexcept {
        if constexpr (detail::numeric_limits<T>::has_infinity) return -detail::numeric_limits<T>::infinity();
        else return detail::numeric_limits<T>::lowest();
    }
};

template <class T>
    requires std::is_integral_v<T>
struct reduce_traits<bit_and, T> {
    static constexpr bool is_commutative = true;
    CHORUS_HOST_DEVICE static constexpr T identity() noexcept { return static_cast<T>(~T{}); }
};

template <class T>
    requires std::is_integral_v<T>
struct reduce_traits<bit_or, T> {
    static constexpr bool is_commutative = true;
    CHORUS_HOST_DEVICE static constexpr T identity() noexcept { return T{}; }
};

template <class T>
    requires std::is_integral_v<T>
struct reduce_traits<bit_xor, T> {
    static constexpr bool is_commutative = true;
    CHORUS_HOST_DEVICE static constexpr T identity() noexcept { return T{}; }
};

/// A user operation declared commutative: `chorus::commutative([](int a, int b) { ... })`.
/// Plain lambdas are treated as non-commutative (order-preserving schedules); wrapping one
/// lets the front doors pick ring schedules as well.
template <class Op>
struct commutative_op : Op {
    using Op::operator();
};

template <class Op>
constexpr commutative_op<Op> commutative(Op op) {
    return commutative_op<Op>{std::move(op)};
}

template <class Op, class T>
struct reduce_traits<commutative_op<Op>, T> : reduce_traits<Op, T> {
    static constexpr bool is_commutative = true;
};

} // namespace chorus
