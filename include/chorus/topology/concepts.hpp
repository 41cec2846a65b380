// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// The topology concepts: who talks to whom in a group of size() ranks.
// Contract: docs/concepts.md#topology.

#include <concepts>
#include <ranges>

#include <chorus/fwd.hpp>

namespace chorus {

/// A range whose elements are ranks.
template <class R>
concept rank_range = std::ranges::input_range<R> && std::convertible_to<std::ranges::range_value_t<R>, rank_t>;

/// Who talks to whom in a `size()`-rank group: `neighbours(r)` lists every rank that `r`
/// exchanges messages with under this topology, without repetition.
template <class T>
concept topology = requires(T const& t, rank_t r) {
    { t.size() } noexcept -> std::same_as<rank_t>;
    { t.neighbours(r) } -> rank_range;
};

/// A topology that is a rooted spanning tree (or DAG) over all ranks. `parents(r)` is empty
/// exactly for the root; `children(r)` lists the ranks whose parent is `r`, ordered so that
/// a child's subtree comes before the next child's subtree in the tree's own rank order
/// (for the binomial tree rooted at 0: subtrees cover consecutive rank intervals).
template <class T>
concept tree_topology = topology<T> && requires(T const& t, rank_t r) {
    { t.root() } noexcept -> std::same_as<rank_t>;
    { t.parents(r) } -> rank_range;
    { t.children(r) } -> rank_range;
};

} // namespace chorus
