// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

#include <concepts>
#include <type_traits>

#include <chorus/fwd.hpp>

namespace chorus {

/// Whether `op(a, b) == op(b, a)` for all `a, b` of type `T` (see reduce_traits).
template <class Op, class T>
inline constexpr bool is_commutative_v = reduce_traits<std::remove_cvref_t<Op>, T>::is_commutative;

/// An operation with a final step applied once to each reduced element, as AVG divides the
/// sum by the number of ranks: `op.finalize(x, p)`.
template <class Op, class T>
concept has_finalize = requires(Op const& op, T const& x, rank_t p) {
    { op.finalize(x, p) } -> std::convertible_to<T>;
};

} // namespace chorus
