// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// What the hierarchical algorithms (hierarchical_allreduce, hierarchical_broadcast,
// hierarchical_allgather) ask of a transport that knows its nodes (node_transport's
// hierarchy(): transport/node.hpp), and the rank arithmetic they share.

#include <concepts>
#include <cstddef>
#include <vector>

#include <chorus/fwd.hpp>

namespace chorus::detail {

/// A transport that knows its nodes and has views of them (node_transport): `local()` holds
/// the ranks of this rank's node, `rail()` the ranks of this rank's local rank on every node
/// (rail 0: the nodes' leaders), both numbered in rank order.
template <class T>
concept node_hierarchy = requires(T& t, rank_t r) {
    { t.hierarchy().nodes() } -> std::same_as<rank_t>;
    { t.hierarchy().equal_nodes() } -> std::same_as<bool>;
    { t.hierarchy().node_of(r) } -> std::same_as<rank_t>;
    { t.hierarchy().local_rank_of(r) } -> std::same_as<rank_t>;
    t.hierarchy().local();
    t.hierarchy().rail();
};

/// The ranks of local rank `j` (rail j), in rank order: rank rail_ranks(h, j)[t] is rank t of
/// that rail's view.
template <class Hierarchy>
std::vector<rank_t> rail_ranks(Hierarchy const& h, rank_t j) {
    std::vector<rank_t> ranks;
    for (rank_t r = 0; r < h.size(); ++r)
        if (h.local_rank_of(r) == j) ranks.push_back(r);
    return ranks;
}

/// Rank r's number in its rail's view: how many ranks before it have its local rank.
template <class Hierarchy>
rank_t rail_rank_of(Hierarchy const& h, rank_t r) {
    rank_t t = 0;
    for (rank_t q = 0; q < r; ++q) t += h.local_rank_of(q) == h.local_rank_of(r) ? 1 : 0;
    return t;
}

} // namespace chorus::detail
