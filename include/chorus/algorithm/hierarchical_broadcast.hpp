// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Hierarchical broadcast: for ranks grouped in nodes (node_transport), the vector crosses the
// network once into every node and spreads inside it through memory.
// Equal nodes: the root's local rank k has a rank on every node; rail k (local rank k of every
// node) broadcasts from the root over the network, then each node broadcasts from its rank k.
// Unequal nodes: the root's node broadcasts from the root first (if it is not the node's
// leader), the leaders (rail 0) broadcast from the root's node's leader, and every other node
// broadcasts from its leader.
// Cost, N nodes of m ranks, n bytes, each phase a binomial tree: the network carries n into
// each of N - 1 nodes (ceil(log2 N) steps), memory into m - 1 ranks per node (ceil(log2 m)
// steps). A flat tree over Nm ranks takes as many steps, but which of them cross the network
// depends on how the ranks are numbered: with ranks dealt to 2 nodes in turn (rank r on node
// r % 2), the tree's last step alone sends the vector into the other node once for each of
// its ranks.
// Each phase is a broadcast of its own over the node_transport's views (node.hpp), chosen
// automatically for its size. Over a transport that knows no nodes the group is one node: the
// automatic broadcast.

#include <cstddef>
#include <span>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/hierarchy.hpp>
#include <chorus/collectives.hpp>  // its phases are collectives (collectives.hpp includes this header at its end)
#include <chorus/detail/schedule.hpp>
#include <chorus/fwd.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Copies `data` from `root` to every rank, in place: across the nodes, then inside each.
template <transport Transport, class T>
void hierarchical_broadcast(Transport& tp, std::span<T> data, rank_t root) {
    detail::check_root(tp, root, "broadcast");
    if constexpr (detail::node_hierarchy<Transport>) {
        auto& h = tp.hierarchy();
        auto& local = h.local();
        rank_t const k = h.local_rank_of(root);
        if (h.equal_nodes()) {
            if (local.rank() == k) chorus::broadcast<automatic>(h.rail(), data, detail::rail_rank_of(h, root));
            chorus::broadcast<automatic>(local, data, k);
        } else {
            // The nodes are numbered in the order of their first ranks, and so are the leaders.
            bool const first_inside = h.node_of(root) == h.node_of(tp.rank()) && k != 0;
            if (first_inside) chorus::broadcast<automatic>(local, data, k);
            if (local.rank() == 0) chorus::broadcast<automatic>(h.rail(), data, h.node_of(root));
            if (!first_inside) chorus::broadcast<automatic>(local, data, 0);
        }
    } else {
        chorus::broadcast<automatic>(tp, data, root);
    }
}

namespace detail {
template <>
inline constexpr auto schedule<collective_kind::broadcast, hierarchical> = [](auto&... a) { hierarchical_broadcast(a...); };
} // namespace detail

} // namespace chorus
