// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// An alltoallv's layout, checked once by every schedule of it (pairwise, zero_copy): the counts
// and displacements of each block, as size_t, against the buffers they must fit. What one rank
// can check alone fails the group here, before any exchange; a count only its peer knows (what
// a rank sends against what the receiver expects) is the schedule's to check.

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/counts.hpp>
#include <chorus/ranges.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus::detail {

/// Block j of the send buffer (for rank j) and of the receive buffer (from rank j), in elements.
struct alltoallv_layout {
    std::vector<std::size_t> send_counts, send_displs, recv_counts, recv_displs;
};

template <transport Transport>
void check_layout(Transport& tp, std::vector<std::size_t> const& counts, std::vector<std::size_t> const& displs,
                  std::size_t buffer, char const* what) {
    for (std::size_t i = 0; i < counts.size(); ++i)
        check_size(tp, displs[i] <= buffer && counts[i] <= buffer - displs[i], "alltoallv",
                   std::string(what) + " block for rank " + std::to_string(i) + " [" + std::to_string(displs[i]) + ", " +
                       std::to_string(displs[i] + counts[i]) + ") overruns the " + std::to_string(buffer) +
                       "-element buffer");
}

// What a rank sends itself is what it receives from itself.
template <transport Transport>
alltoallv_layout const& check_self(Transport& tp, alltoallv_layout const& l) {
    auto const me = static_cast<std::size_t>(tp.rank());
    check_size(tp, l.send_counts[me] == l.recv_counts[me], "alltoallv",
               "this rank sends itself " + std::to_string(l.send_counts[me]) + " elements but expects to receive " +
                   std::to_string(l.recv_counts[me]));
    return l;
}

/// Packed blocks: the counts must sum to each buffer's size.
template <transport Transport, count_range SendCounts, count_range RecvCounts>
alltoallv_layout packed_alltoallv_layout(Transport& tp, std::size_t send, SendCounts const& send_counts, std::size_t recv,
                                         RecvCounts const& recv_counts) {
    alltoallv_layout l;
    l.send_counts = checked_counts(tp, send_counts, "alltoallv", "send_counts");
    l.recv_counts = checked_counts(tp, recv_counts, "alltoallv", "recv_counts");
    l.send_displs = exclusive_prefix_sum(l.send_counts);
    l.recv_displs = exclusive_prefix_sum(l.recv_counts);
    std::size_t const send_total = total_of(l.send_counts), recv_total = total_of(l.recv_counts);
    check_size(tp, send_total == send, "alltoallv",
               "send_counts sum to " + std::to_string(send_total) + " but the send buffer holds " + std::to_string(send) + " elements");
    check_size(tp, recv_total == recv, "alltoallv",
               "recv_counts sum to " + std::to_string(recv_total) + " but the receive buffer holds " + std::to_string(recv) +
                   " elements");
    check_self(tp, l);
    return l;
}

/// Explicit displacements: every block inside its buffer, receive blocks apart (they are
/// written concurrently).
template <transport Transport, count_range SendCounts, count_range SendDispls, count_range RecvCounts, count_range RecvDispls>
alltoallv_layout placed_alltoallv_layout(Transport& tp, std::size_t send, SendCounts const& send_counts,
                                         SendDispls const& send_displs, std::size_t recv, RecvCounts const& recv_counts,
                                         RecvDispls const& recv_displs) {
    alltoallv_layout l;
    l.send_counts = checked_counts(tp, send_counts, "alltoallv", "send_counts");
    l.send_displs = checked_counts(tp, send_displs, "alltoallv", "send_displs");
    l.recv_counts = checked_counts(tp, recv_counts, "alltoallv", "recv_counts");
    l.recv_displs = checked_counts(tp, recv_displs, "alltoallv", "recv_displs");
    check_layout(tp, l.send_counts, l.send_displs, send, "send");
    check_layout(tp, l.recv_counts, l.recv_displs, recv, "receive");
    auto const& rc = l.recv_counts;
    auto const& rd = l.recv_displs;
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < rc.size(); ++i)
        if (rc[i] != 0) order.push_back(i);
    std::ranges::sort(order, [&](std::size_t a, std::size_t b) { return rd[a] < rd[b]; });
    for (std::size_t k = 1; k < order.size(); ++k) {
        std::size_t const a = order[k - 1], b = order[k];
        check_size(tp, rd[a] + rc[a] <= rd[b], "alltoallv",
                   "receive blocks of ranks " + std::to_string(a) + " and " + std::to_string(b) + " overlap");
    }
    check_self(tp, l);
    return l;
}

/// Block j of `buffer` under `counts` and `displs`.
template <class T>
std::span<T> alltoallv_block(std::span<T> buffer, std::vector<std::size_t> const& counts, std::vector<std::size_t> const& displs,
                             rank_t j) {
    auto const i = static_cast<std::size_t>(j);
    return buffer.subspan(displs[i], counts[i]);
}

} // namespace chorus::detail
