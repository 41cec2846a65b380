// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Ring reduce-scatter with a count per rank (MPI_Reduce_scatter): the ring reduce-scatter's
// steps (detail::ring_reduce_scatter_steps) over blocks of the counts' sizes.
// Cost: (p - 1) * alpha + (total - own) * (beta + gamma) per rank; the largest block sets the
// pace of each step. Needs a commutative op (see ring_allreduce).

#include <algorithm>
#include <span>
#include <vector>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/counts.hpp>
#include <chorus/algorithm/ring_reduce_scatter.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/ranges.hpp>
#include <chorus/reduce/concepts.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Reduces every rank's `send` (blocks of recv_counts[0], recv_counts[1], ... elements, packed
/// in rank order) element-wise with the commutative `op`; rank r receives block r's reduction.
/// @throws chorus::invalid_argument for counts of the wrong length or negative, counts that do
/// not sum to send.size(), or recv_counts[me] != recv.size().
template <transport Transport, class T, count_range Counts, reduce_op<T> Op>
void ring_reduce_scatterv(Transport& tp, std::span<T const> send, std::span<T> recv, Counts const& recv_counts, Op op) {
    static_assert(is_commutative_v<Op, T>,
                  "ring_reduce_scatterv combines contributions in ring order, which needs a commutative op: "
                  "wrap a commutative function in chorus::commutative(f), or use tree_reduce_scatterv");
    rank_t const p = tp.size();
    auto const counts = detail::reduce_scatterv_counts(tp, recv_counts, send.size(), recv.size());
    auto const displs = detail::exclusive_prefix_sum(counts);
    tag_t const tag = detail::begin_collective(tp, detail::collective_kind::reduce_scatterv);
    auto const own = [&](rank_t i) {
        std::size_t const k = detail::ring_index(i, p);
        return send.subspan(displs[k], counts[k]);
    };
    detail::ring_reduce_scatter_steps(tp, tag, own, std::ranges::max(counts), recv, op);
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::reduce_scatterv, ring> =
    [](auto&... a) { ring_reduce_scatterv(a...); };
}

} // namespace chorus
