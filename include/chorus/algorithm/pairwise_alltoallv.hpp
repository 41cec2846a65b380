// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Pairwise variable-size alltoall (the seed's AllToAllv, MoE token dispatch/combine).
// Rank i sends send_counts[j] elements to rank j, from send_displs[j]; it receives
// recv_counts[j] elements from rank j into recv_displs[j]. Displacements default to the
// exclusive prefix sums of the counts (blocks packed in rank order).
// Schedule: detail::pairwise_exchange, every block a message of its own size (zero-length
// messages included, so a receiver always learns when a sender disagrees about a count: the
// transport reports a size mismatch naming the sender).
// Cost: (p - 1) * alpha + (bytes sent + bytes received) * beta per rank.

#include <span>

#include <chorus/algorithm/detail/alltoallv_layout.hpp>
#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/pairwise_exchange.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/ranges.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

namespace detail {

template <transport Transport, class T>
void alltoallv_exchange(Transport& tp, std::span<T const> send, std::span<T> recv, alltoallv_layout const& l) {
    tag_t const tag = begin_collective(tp, collective_kind::alltoallv);
    pairwise_exchange(
        tp, tag, [&](rank_t r) { return alltoallv_block(send, l.send_counts, l.send_displs, r); },
        [&](rank_t r) { return alltoallv_block(recv, l.recv_counts, l.recv_displs, r); }, recv.size_bytes());
}

} // namespace detail

/// Variable-size alltoall with packed blocks: the counts must sum to each buffer's size.
/// @throws chorus::invalid_argument for counts of the wrong length, negative counts, counts
/// that do not sum to the buffer, or send_counts[me] != recv_counts[me]; a peer that
/// disagrees about a count causes a size mismatch naming it.
template <transport Transport, class T, count_range SendCounts, count_range RecvCounts>
void pairwise_alltoallv(Transport& tp, std::span<T const> send, SendCounts const& send_counts, std::span<T> recv,
                        RecvCounts const& recv_counts) {
    detail::alltoallv_exchange(tp, send, recv, detail::packed_alltoallv_layout(tp, send.size(), send_counts, recv.size(), recv_counts));
}

/// Variable-size alltoall with explicit displacements (element offsets of each block).
/// Receive blocks must not overlap.
template <transport Transport, class T, count_range SendCounts, count_range SendDispls, count_range RecvCounts,
          count_range RecvDispls>
void pairwise_alltoallv(Transport& tp, std::span<T const> send, SendCounts const& send_counts, SendDispls const& send_displs,
                        std::span<T> recv, RecvCounts const& recv_counts, RecvDispls const& recv_displs) {
    detail::alltoallv_exchange(tp, send, recv,
                               detail::placed_alltoallv_layout(tp, send.size(), send_counts, send_displs, recv.size(), recv_counts,
                                                               recv_displs));
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::alltoallv, pairwise> =
    [](auto&... a) { pairwise_alltoallv(a...); };
}

} // namespace chorus
