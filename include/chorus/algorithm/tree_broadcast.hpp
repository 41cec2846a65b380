// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Tree broadcast, by default over the binomial tree rooted at `root`.
// Schedule: receive the vector from the parent, then forward it to every child, the child
// with the largest subtree first (so the deepest branch starts earliest).
// Cost (binomial): ceil(log2 p) * (alpha + n * beta) on the critical path; each rank sends
// at most ceil(log2 p) copies. Latency-optimal; for large n a scatter + allgather schedule
// moves fewer bytes per link.

#include <ranges>
#include <span>
#include <vector>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/topology/binomial_tree.hpp>
#include <chorus/topology/concepts.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

namespace detail {
template <transport Transport, tree_topology Tree, class T>
void tree_broadcast_steps(Transport& tp, tag_t tag, Tree const& tree, std::span<T> data) {
    rank_t const me = tp.rank();
    for (rank_t parent : tree.parents(me)) {
        recv(tp, tag, parent, data);
        break;  // one copy suffices if the topology is a DAG with several parents
    }
    auto const children = tree.children(me);
    std::vector<typename Transport::request> sends;
    sends.reserve(std::ranges::size(children));
    for (auto it = std::ranges::end(children); it != std::ranges::begin(children);)
        sends.push_back(tp.isend(*--it, tag, bytes_of(data)));
    for (auto& s : sends) s.wait();
}
} // namespace detail

/// Copies `data` from `tree.root()` to every rank along `tree`, in place.
/// Collective: every rank passes an equal tree over `tp.size()` ranks and the same size.
template <transport Transport, tree_topology Tree, class T>
void tree_broadcast(Transport& tp, Tree const& tree, std::span<T> data) {
    detail::check_size(tp, tree.size() == tp.size(), "broadcast",
                       "the tree spans " + std::to_string(tree.size()) + " ranks, the group " +
                           std::to_string(tp.size()));
    detail::check_root(tp, tree.root(), "broadcast");
    tag_t const tag = detail::begin_collective(tp, detail::collective_kind::broadcast);
    detail::tree_broadcast_steps(tp, tag, tree, data);
}

/// Copies `data` from `root` to every rank over the binomial tree, in place.
template <transport Transport, class T>
void tree_broadcast(Transport& tp, std::span<T> data, rank_t root) {
    detail::check_root(tp, root, "broadcast");
    tree_broadcast(tp, binomial_tree(tp.size(), root), data);
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::broadcast, tree> = [](auto&... a) { tree_broadcast(a...); };
}

} // namespace chorus
