// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Hierarchical allgather: for ranks grouped in nodes of equal size (node_transport), each
// block crosses the network once into every other node.
// Rail i (local rank i of every node) allgathers its N blocks over the network; then each node
// allgathers its m rails' sets through memory, into a scratch of p blocks ordered by local
// rank, then node; the blocks are copied into rank order. Nodes of unequal sizes, or one rank
// per node: the automatic allgather over all ranks.
// Cost, N nodes of m ranks, blocks of b bytes: the network carries (N-1) m b into each node,
// the least an allgather can; memory (m-1) N b per rank, plus a copy of the p blocks. A flat
// ring over Nm ranks moves the same p - 1 blocks per rank, and as many of its links cross the
// network as the numbering of the ranks makes: 2 of 4 at 2 nodes x 2 ranks numbered by node,
// every link when they are dealt to the nodes in turn.
// Each phase is an allgather of its own over the node_transport's views (node.hpp), chosen
// automatically for its size.

#include <cstddef>
#include <span>
#include <vector>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/hierarchy.hpp>
#include <chorus/collectives.hpp>  // its phases are collectives (collectives.hpp includes this header at its end)
#include <chorus/detail/schedule.hpp>
#include <chorus/fwd.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Every rank receives every rank's `send` into `recv`, in rank order: across the nodes along
/// the rails, then inside each node.
template <transport Transport, class T>
void hierarchical_allgather(Transport& tp, std::span<T const> send, std::span<T> recv) {
    using space = typename Transport::memory_space;
    std::size_t const n = send.size();
    detail::check_blocks(tp, "allgather", "the receive buffer", recv.size(), "send.size()", n);
    if constexpr (detail::node_hierarchy<Transport>) {
        auto& h = tp.hierarchy();
        auto& local = h.local();
        auto const m = static_cast<std::size_t>(local.size());
        if (h.equal_nodes() && m > 1 && h.nodes() > 1) {
            auto const nodes = static_cast<std::size_t>(h.nodes());
            typename space::template buffer<T> rail(nodes * n), all(m * nodes * n);
            chorus::allgather<automatic>(h.rail(), send, rail.span());
            chorus::allgather<automatic>(local, detail::as_const(rail.span()), all.span());
            // all: local rank j's rail set, that is block t of rank rail_ranks(j)[t], for j in order.
            for (std::size_t j = 0; j < m; ++j) {
                std::vector<rank_t> const ranks = detail::rail_ranks(h, static_cast<rank_t>(j));
                for (std::size_t t = 0; t < nodes; ++t)
                    detail::copy_part<space>(recv.subspan(static_cast<std::size_t>(ranks[t]) * n, n),
                                             detail::as_const(all.span().subspan((j * nodes + t) * n, n)), recv.size_bytes());
            }
            return;
        }
    }
    chorus::allgather<automatic>(tp, send, recv);
}

namespace detail {
template <>
inline constexpr auto schedule<collective_kind::allgather, hierarchical> = [](auto&... a) { hierarchical_allgather(a...); };
} // namespace detail

} // namespace chorus
