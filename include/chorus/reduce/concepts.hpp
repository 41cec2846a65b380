// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// The reduce_op concept family. Contract: docs/concepts.md#reduce_op.

#include <concepts>
#include <type_traits>

#include <chorus/config.hpp>
#include <chorus/reduce/traits.hpp>

namespace chorus {

/// A binary operation on `T`, callable as `op(a, b)` and associative (up to floating-point
/// rounding). It is device-callable when its `operator()` is marked `CHORUS_HOST_DEVICE`.
/// Without further traits chorus assumes it is not commutative and routes it to schedules
/// that combine contributions in rank order.
template <class Op, class T>
concept reduce_op = std::copy_constructible<Op> && requires(Op const& op, T const& a, T const& b) {
    { op(a, b) } -> std::convertible_to<T>;
};

/// A reduce_op with `op(a, b) == op(b, a)`, declared through `reduce_traits` (the built-in
/// ops do) or by wrapping a user function in `chorus::commutative(f)`.
template <class Op, class T>
concept commutative_reduce_op = reduce_op<Op, T> && is_commutative_v<Op, T>;

/// A reduce_op whose identity element is known: `op(e, x) == op(x, e) == x`.
template <class Op, class T>
concept reduce_op_with_identity = reduce_op<Op, T> && requires {
    { reduce_traits<std::remove_cvref_t<Op>, T>::identity() } -> std::same_as<T>;
};

/// The identity element of `op` on `T` (-0.0 for a floating-point sum, +inf for minimum).
template <class T, class Op>
    requires reduce_op_with_identity<Op, T>
CHORUS_HOST_DEVICE constexpr T identity_element(Op const&) noexcept {
    return reduce_traits<std::remove_cvref_t<Op>, T>::identity();
}

} // namespace chorus
