// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Tree reduce-scatter with a count per rank: the tree reduce-scatter's steps
// (detail::tree_reduce_scatter_steps): a binomial reduce of the whole vector to rank 0 in rank
// order, then block r of the counts' sizes to rank r.
// Cost: ceil(log2 p) * (alpha + total beta + total gamma) + (p - 1) alpha + (total - own) beta:
// the schedule for non-commutative ops.

#include <span>
#include <vector>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/counts.hpp>
#include <chorus/algorithm/tree_reduce_scatter.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/ranges.hpp>
#include <chorus/reduce/concepts.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// ring_reduce_scatterv's contract for any op: contributions combine in rank order.
template <transport Transport, class T, count_range Counts, reduce_op<T> Op>
void tree_reduce_scatterv(Transport& tp, std::span<T const> send, std::span<T> recv, Counts const& recv_counts, Op op) {
    auto const counts = detail::reduce_scatterv_counts(tp, recv_counts, send.size(), recv.size());
    auto const displs = detail::exclusive_prefix_sum(counts);
    tag_t const tag = detail::begin_collective(tp, detail::collective_kind::reduce_scatterv);
    detail::tree_reduce_scatter_steps(tp, tag, send, recv, op, [&](std::span<T> acc, rank_t r) {
        return acc.subspan(displs[static_cast<std::size_t>(r)], counts[static_cast<std::size_t>(r)]);
    });
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::reduce_scatterv, tree> =
    [](auto&... a) { tree_reduce_scatterv(a...); };
}

} // namespace chorus
