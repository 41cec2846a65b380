// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Scatter-allgather broadcast (van de Geijn; MPICH's long-message broadcast).
// Schedule: cut the vector into p near-equal blocks, block i belonging to virtual rank
// i = r - root (mod p). Scatter: over the binomial tree rooted at `root`, each rank
// receives from its parent the blocks of its subtree (virtual ranks [v, v + subtree size),
// one contiguous span) and sends each child the blocks of the child's subtree, largest
// subtree first. Allgather: the ring allgather of the p blocks over virtual ranks
// (detail::ring_allgather_steps), in which no block is sent to a rank that holds it from
// the scatter: the root receives nothing, and the ring may start while scatter sends are
// still in flight, since no ring receive writes into a block the rank holds.
// Cost: ceil(log2 p) * alpha + (p-1)/p * n * beta for the scatter (the root sends n/2,
// n/4, ...), (p - 1) * alpha + (p-1)/p * n * beta for the allgather: about
// (log2 p + p - 1) * alpha + 2 (p-1)/p * n * beta, against ceil(log2 p) * (alpha + n * beta)
// for the binomial tree. It wins for long vectors once 2 (p-1)/p < ceil(log2 p), i.e. from
// p = 3 on; for p = 2 it sends the two halves one after the other (2 alpha + n beta), never
// better than the tree's single message.

#include <ranges>
#include <span>
#include <vector>

#include <chorus/algorithm/ring_allgather.hpp>
#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/topology/binomial_tree.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Copies `data` from `root` to every rank, in place.
/// Collective: every rank passes the same `root` and the same `data.size()`.
/// @throws chorus::invalid_argument for a bad root; chorus::transport_error on failure.
template <transport Transport, class T>
void scatter_allgather_broadcast(Transport& tp, std::span<T> data, rank_t root) {
    detail::check_root(tp, root, "broadcast");
    tag_t const tag = detail::begin_collective(tp, detail::collective_kind::broadcast);
    rank_t const p = tp.size();
    rank_t const me = tp.rank();
    if (p == 1) return;
    auto const parts = static_cast<std::size_t>(p);
    binomial_tree const tree(p, root);
    auto const virtual_rank = [&](rank_t r) { return static_cast<rank_t>(detail::ring_index(r - root, p)); };
    auto const real_rank = [&](rank_t v) { return static_cast<rank_t>(detail::ring_index(v + root, p)); };
    // Blocks [v, v + subtree size) of the rank at virtual position v: contiguous, no wrap.
    auto const subtree_blocks = [&](rank_t r) {
        auto const v = static_cast<std::size_t>(virtual_rank(r));
        return detail::blocks(data, v, v + static_cast<std::size_t>(tree.subtree_size(r)), parts);
    };

    for (rank_t parent : tree.parents(me)) detail::recv(tp, tag, parent, subtree_blocks(me));
    auto const children = tree.children(me);
    std::vector<typename Transport::request> sends;
    sends.reserve(std::ranges::size(children));
    for (auto it = std::ranges::end(children); it != std::ranges::begin(children);) {
        rank_t const child = *--it;
        sends.push_back(tp.isend(child, tag, detail::bytes_of(detail::as_const(subtree_blocks(child)))));
    }

    detail::ring_allgather_steps(
        tp, tag, virtual_rank(me), [&](rank_t i) { return detail::block(data, static_cast<std::size_t>(i), parts); },
        [&](rank_t u, rank_t i) { return i >= u && i < u + tree.subtree_size(real_rank(u)); });
    for (auto& s : sends) s.wait();
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::broadcast, scatter_allgather> =
    [](auto&... a) { scatter_allgather_broadcast(a...); };
}

} // namespace chorus
