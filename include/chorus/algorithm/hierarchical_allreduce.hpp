// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Hierarchical allreduce: for ranks grouped in nodes (node_transport: the ranks of a host share
// memory, the hosts talk over the network), most bytes stay inside the nodes.
// Rails (vectors of hierarchical_rail_bytes and more, every node with m > 1 ranks): the vector
// is cut into m near-equal blocks; a reduce-scatter inside each node leaves local rank i with
// block i reduced over its node; local rank i of every node (rail i) allreduces block i over
// the network; an allgather inside each node puts the blocks back together. The m rails run at
// once, each over its own connections.
// Leaders (smaller vectors, or nodes of unequal sizes): a tree reduce to each node's first rank
// (its leader), an allreduce among the leaders (rail 0) over the network, a tree broadcast from
// the leader inside each node.
// Cost, N nodes of m ranks, n bytes, ring allreduces: rails move 2(N-1)/N * n/m per rank over
// the network and 2(m-1)/m * n through memory; a flat ring over all Nm ranks moves
// 2(Nm-1)/(Nm) * n per rank, and its every step waits for its slowest link (a network one).
// Leaders: log2 m memory steps and a network allreduce of the whole vector among N ranks,
// each twice, instead of a latency of log2(Nm) network steps.
// Each phase is a collective of its own over the node_transport's views (node.hpp), chosen
// automatically for its size. The op must be commutative (contributions are combined node by
// node, not in rank order); an op with a final step (AVG) gets it once, at the end, over all
// ranks. Over a transport that knows no nodes the group is one node: reduce to rank 0, then
// broadcast from it.

#include <concepts>
#include <cstddef>
#include <span>
#include <vector>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/hierarchy.hpp>
#include <chorus/config.hpp>
#include <chorus/collectives.hpp>  // its phases are collectives (collectives.hpp includes this header at its end)
#include <chorus/detail/schedule.hpp>
#include <chorus/fwd.hpp>
#include <chorus/reduce/concepts.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

namespace detail {

/// `Op` without its final step: the phases combine, the end finalizes once over every rank.
template <class Op>
struct unfinalized {
    Op op;
    template <class T>
    CHORUS_HOST_DEVICE constexpr T operator()(T const& a, T const& b) const {
        return op(a, b);
    }
};

// Rails from 64 KiB: below, the m - 1 extra memory steps and m network messages of n/m bytes
// cost more than the leaders' one message of n.
inline constexpr std::size_t hierarchical_rail_bytes = 64 * 1024;

} // namespace detail

template <class Op, class T>
struct reduce_traits<detail::unfinalized<Op>, T> : reduce_traits<Op, T> {};

/// Reduces `data` over all ranks with the commutative `op`, in place: inside each node, across
/// the nodes, inside again (see above).
template <transport Transport, class T, reduce_op<T> Op>
void hierarchical_allreduce(Transport& tp, std::span<T> data, Op op) {
    using space = typename Transport::memory_space;
    if constexpr (has_finalize<Op, T>) {
        hierarchical_allreduce(tp, data, detail::unfinalized<Op>{op});
        space::finalize(data, op, tp.size());
    } else if constexpr (detail::node_hierarchy<Transport>) {
        auto& h = tp.hierarchy();
        auto& local = h.local();
        auto const m = static_cast<std::size_t>(local.size());
        if (h.equal_nodes() && m > 1 && data.size_bytes() >= detail::hierarchical_rail_bytes) {
            std::vector<std::size_t> counts(m, data.size() / m);
            for (std::size_t i = 0; i < data.size() % m; ++i) ++counts[i];
            typename space::template buffer<T> block(counts[static_cast<std::size_t>(local.rank())]);
            chorus::reduce_scatter(local, detail::as_const(data), block.span(), counts, op);
            chorus::allreduce<automatic>(h.rail(), block.span(), op);
            chorus::allgatherv(local, detail::as_const(block.span()), data, counts);
        } else {
            chorus::reduce<automatic>(local, data, op, 0);
            if (local.rank() == 0) chorus::allreduce<automatic>(h.rail(), data, op);
            chorus::broadcast<automatic>(local, data, 0);
        }
    } else {
        chorus::reduce<automatic>(tp, data, op, 0);
        chorus::broadcast<automatic>(tp, data, 0);
    }
}

namespace detail {
template <>
inline constexpr auto schedule<collective_kind::allreduce, hierarchical> = [](auto&... a) { hierarchical_allreduce(a...); };
template <class T, class Op>
inline constexpr bool schedule_applies<collective_kind::allreduce, hierarchical, T, Op> = is_commutative_v<Op, T>;
} // namespace detail

} // namespace chorus
