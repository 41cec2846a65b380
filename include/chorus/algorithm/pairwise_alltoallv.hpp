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

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <ranges>
#include <span>
#include <string>
#include <vector>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/counts.hpp>
#include <chorus/algorithm/detail/pairwise_exchange.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/ranges.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

namespace detail {

template <transport Transport>
void check_layout(Transport& tp, std::vector<std::size_t> const& counts, std::vector<std::size_t> const& displs,
                  std::size_t buffer, char const* what) {
    for (std::size_t i = 0; i < counts.size(); ++i)
        check_size(tp, displs[i] <= buffer && counts[i] <= buffer - displs[i], "alltoallv",
                   std::string(what) + " block for rank " + std::to_string(i) + " [" + std::to_string(displs[i]) + ", " +
                       std::to_string(displs[i] + counts[i]) + ") overruns the " + std::to_string(buffer) +
                       "-element buffer");
}

template <transport Transport, class T>
void alltoallv_exchange(Transport& tp, std::span<T const> send, std::vector<std::size_t> const& send_counts,
                        std::vector<std::size_t> const& send_displs, std::span<T> recv,
                        std::vector<std::size_t> const& recv_counts, std::vector<std::size_t> const& recv_displs) {
    auto const me = static_cast<std::size_t>(tp.rank());
    check_size(tp, send_counts[me] == recv_counts[me], "alltoallv",
               "this rank sends itself " + std::to_string(send_counts[me]) + " elements but expects to receive " +
                   std::to_string(recv_counts[me]));
    tag_t const tag = begin_collective(tp, collective_kind::alltoallv);
    pairwise_exchange(
        tp, tag,
        [&](rank_t r) {
            auto const i = static_cast<std::size_t>(r);
            return send.subspan(send_displs[i], send_counts[i]);
        },
        [&](rank_t r) {
            auto const i = static_cast<std::size_t>(r);
            return recv.subspan(recv_displs[i], recv_counts[i]);
        });
}

} // namespace detail

/// Variable-size alltoall with packed blocks: the counts must sum to each buffer's size.
/// @throws chorus::invalid_argument for counts of the wrong length, negative counts, counts
/// that do not sum to the buffer, or send_counts[me] != recv_counts[me]; a peer that
/// disagrees about a count causes a size mismatch naming it.
template <transport Transport, class T, count_range SendCounts, count_range RecvCounts>
void pairwise_alltoallv(Transport& tp, std::span<T const> send, SendCounts const& send_counts, std::span<T> recv,
               RecvCounts const& recv_counts) {
    auto const sc = detail::checked_counts(tp, send_counts, "alltoallv", "send_counts");
    auto const rc = detail::checked_counts(tp, recv_counts, "alltoallv", "recv_counts");
    auto const sd = detail::exclusive_prefix_sum(sc);
    auto const rd = detail::exclusive_prefix_sum(rc);
    std::size_t const send_total = sc.empty() ? 0 : sd.back() + sc.back();
    std::size_t const recv_total = rc.empty() ? 0 : rd.back() + rc.back();
    detail::check_size(tp, send_total == send.size(), "alltoallv",
                       "send_counts sum to " + std::to_string(send_total) + " but the send buffer holds " +
                           std::to_string(send.size()) + " elements");
    detail::check_size(tp, recv_total == recv.size(), "alltoallv",
                       "recv_counts sum to " + std::to_string(recv_total) + " but the receive buffer holds " +
                           std::to_string(recv.size()) + " elements");
    detail::alltoallv_exchange(tp, send, sc, sd, recv, rc, rd);
}

/// Variable-size alltoall with explicit displacements (element offsets of each block).
/// Receive blocks must not overlap.
template <transport Transport, class T, count_range SendCounts, count_range SendDispls, count_range RecvCounts,
          count_range RecvDispls>
void pairwise_alltoallv(Transport& tp, std::span<T const> send, SendCounts const& send_counts, SendDispls const& send_displs,
               std::span<T> recv, RecvCounts const& recv_counts, RecvDispls const& recv_displs) {
    auto const sc = detail::checked_counts(tp, send_counts, "alltoallv", "send_counts");
    auto const sd = detail::checked_counts(tp, send_displs, "alltoallv", "send_displs");
    auto const rc = detail::checked_counts(tp, recv_counts, "alltoallv", "recv_counts");
    auto const rd = detail::checked_counts(tp, recv_displs, "alltoallv", "recv_displs");
    detail::check_layout(tp, sc, sd, send.size(), "send");
    detail::check_layout(tp, rc, rd, recv.size(), "receive");
    // Receives run concurrently: overlapping targets would race.
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < rc.size(); ++i)
        if (rc[i] != 0) order.push_back(i);
    std::ranges::sort(order, [&](std::size_t a, std::size_t b) { return rd[a] < rd[b]; });
    for (std::size_t k = 1; k < order.size(); ++k) {
        std::size_t const a = order[k - 1], b = order[k];
        detail::check_size(tp, rd[a] + rc[a] <= rd[b], "alltoallv",
                           "receive blocks of ranks " + std::to_string(a) + " and " + std::to_string(b) + " overlap");
    }
    detail::alltoallv_exchange(tp, send, sc, sd, recv, rc, rd);
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::alltoallv, pairwise> =
    [](auto&... a) { pairwise_alltoallv(a...); };
}

} // namespace chorus
