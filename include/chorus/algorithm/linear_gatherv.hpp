// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Linear gatherv: gather with a count per rank (MPI_Gatherv with packed blocks).
// Schedule: as linear_gather; the root posts every receive at once, rank r's straight into its
// block (at the sum of the counts of the ranks before it), and copies its own block.
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

/// The root receives rank r's `send` (recv_counts[r] elements) into `recv`, blocks packed in
/// rank order. `recv` and `recv_counts` are read at the root only (may be empty elsewhere).
/// @throws chorus::invalid_argument for a bad root, counts of the wrong length or negative,
/// counts that do not sum to recv.size(), or the root's own count != send.size(); a rank
/// whose send.size() differs from its count causes a size mismatch naming it.
template <transport Transport, class T, count_range Counts>
void linear_gatherv(Transport& tp, std::span<T const> send, std::span<T> recv, Counts const& recv_counts, rank_t root) {
    detail::check_root(tp, root, "gatherv");
    rank_t const p = tp.size(), me = tp.rank();
    std::vector<std::size_t> counts, displs;
    if (me == root) {
        counts = detail::checked_counts(tp, recv_counts, "gatherv", "recv_counts");
        detail::check_packed(tp, "gatherv", "the root's receive buffer", recv.size(), "recv_counts", counts);
        detail::check_size(tp, counts[static_cast<std::size_t>(me)] == send.size(), "gatherv",
                           "the root's recv_counts[" + std::to_string(me) + "] is " +
                               std::to_string(counts[static_cast<std::size_t>(me)]) + " but it sends " +
                               std::to_string(send.size()) + " elements");
        displs = detail::exclusive_prefix_sum(counts);
    }
    tag_t const tag = detail::begin_collective(tp, detail::collective_kind::gatherv);
    if (me != root) {
        detail::send(tp, tag, root, send);
        return;
    }
    auto const block = [&](rank_t r) {
        return recv.subspan(displs[static_cast<std::size_t>(r)], counts[static_cast<std::size_t>(r)]);
    };
    std::vector<typename Transport::request> recvs;
    recvs.reserve(static_cast<std::size_t>(p));
    for (rank_t r = 0; r < p; ++r)
        if (r != root) recvs.push_back(tp.irecv(r, tag, detail::writable_bytes_of(block(r))));
    detail::copy_part<typename Transport::memory_space>(block(root), send, recv.size_bytes());
    for (auto& r : recvs) r.wait();
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::gatherv, linear> = [](auto&... a) { linear_gatherv(a...); };
}

} // namespace chorus
