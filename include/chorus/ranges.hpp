// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// The ranges the front doors accept: messages are contiguous, sized ranges of trivially
// copyable elements (vector, array, span, contiguous range-v3 views), seen as std::span; counts
// and displacements (alltoallv) are sized ranges of integers.

#include <concepts>
#include <ranges>
#include <span>
#include <type_traits>

namespace chorus {

namespace detail {
template <class R>
using element_t = std::remove_cv_t<std::ranges::range_value_t<R>>;
}

/// A range a message can be sent from.
template <class R>
concept message_range = std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
                        std::is_trivially_copyable_v<detail::element_t<R>>;

/// A range a message can be received into.
template <class R>
concept writable_message_range = message_range<R> &&
                                 !std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<R>>>;

/// A range of element counts or displacements, one per rank.
template <class R>
concept count_range = std::ranges::sized_range<R> && std::integral<std::ranges::range_value_t<R>>;

namespace detail {

template <message_range R>
auto to_span(R&& r) noexcept {
    using value = std::remove_reference_t<std::ranges::range_reference_t<R>>;
    return std::span<value>(std::ranges::data(r), std::ranges::size(r));
}

template <message_range R>
auto to_const_span(R const& r) noexcept {
    return std::span<element_t<R> const>(std::ranges::data(r), std::ranges::size(r));
}

} // namespace detail
} // namespace chorus
