// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Linear scatterv: scatter with a count per rank (MPI_Scatterv with packed blocks).
// Schedule: as linear_scatter; the root starts every send at once, rank r's block from the
// sum of the counts of the ranks before it, and copies its own block.
// Cost: (p - 1) * alpha + (total - own) * beta at the root.

#include <span>
#include <string>
#include <vector>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/counts.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/ranges.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Rank r receives send_counts[r] elements of the root's `send` (blocks packed in rank order)
/// into `recv`. `send` and `send_counts` are read at the root only (may be empty elsewhere).
/// @throws chorus::invalid_argument for a bad root, counts of the wrong length or negative,
/// counts that do not sum to send.size(), or the root's own count != recv.size(); a rank
/// whose recv.size() differs from its count gets a size mismatch naming the root.
template <transport Transport, class T, count_range Counts>
void linear_scatterv(Transport& tp, std::span<T const> send, Counts const& send_counts, std::span<T> recv, rank_t root) {
    detail::check_root(tp, root, "scatterv");
    rank_t const p = tp.size(), me = tp.rank();
    std::vector<std::size_t> counts, displs;
    if (me == root) {
        counts = detail::checked_counts(tp, send_counts, "scatterv", "send_counts");
        detail::check_packed(tp, "scatterv", "the root's send buffer", send.size(), "send_counts", counts);
        detail::check_size(tp, counts[static_cast<std::size_t>(me)] == recv.size(), "scatterv",
                           "the root's send_counts[" + std::to_string(me) + "] is " +
                               std::to_string(counts[static_cast<std::size_t>(me)]) + " but it receives " +
                               std::to_string(recv.size()) + " elements");
        displs = detail::exclusive_prefix_sum(counts);
    }
    tag_t const tag = detail::begin_collective(tp, detail::collective_kind::scatterv);
    if (me != root) {
        detail::recv(tp, tag, root, recv);
        return;
    }
    auto const block = [&](rank_t r) {
        return send.subspan(displs[static_cast<std::size_t>(r)], counts[static_cast<std::size_t>(r)]);
    };
    std::vector<typename Transport::request> sends;
    sends.reserve(static_cast<std::size_t>(p));
    for (rank_t r = 0; r < p; ++r)
        if (r != root) sends.push_back(tp.isend(r, tag, detail::bytes_of(block(r))));
    Transport::memory_space::copy(recv, block(root));
    for (auto& s : sends) s.wait();
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::scatterv, linear> = [](auto&... a) { linear_scatterv(a...); };
}

} // namespace chorus
