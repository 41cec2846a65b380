// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Ring allgatherv: allgather with a count per rank (MPI_Allgatherv with packed blocks).
// Schedule: the ring allgather's steps (detail::ring_allgather_steps) over blocks of the
// counts' sizes, each received straight into place and forwarded as soon as it arrived.
// Cost: (p - 1) * alpha + (total - own) * beta per rank: the largest block sets the pace of
// each step, so a skewed count costs up to (p - 1) * largest * beta.

#include <span>
#include <string>
#include <vector>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/counts.hpp>
#include <chorus/algorithm/ring_allgather.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/ranges.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Every rank receives rank r's `send` (recv_counts[r] elements) into `recv`, blocks packed in
/// rank order. Every rank passes the same counts.
/// @throws chorus::invalid_argument for counts of the wrong length or negative, counts that do
/// not sum to recv.size(), or recv_counts[me] != send.size(); a rank that disagrees about a
/// count causes a size mismatch naming it.
template <transport Transport, class T, count_range Counts>
void ring_allgatherv(Transport& tp, std::span<T const> send, std::span<T> recv, Counts const& recv_counts) {
    rank_t const me = tp.rank();
    auto const counts = detail::checked_counts(tp, recv_counts, "allgatherv", "recv_counts");
    detail::check_packed(tp, "allgatherv", "the receive buffer", recv.size(), "recv_counts", counts);
    detail::check_size(tp, counts[static_cast<std::size_t>(me)] == send.size(), "allgatherv",
                       "recv_counts[" + std::to_string(me) + "] is " + std::to_string(counts[static_cast<std::size_t>(me)]) +
                           " but this rank sends " + std::to_string(send.size()) + " elements");
    auto const displs = detail::exclusive_prefix_sum(counts);
    tag_t const tag = detail::begin_collective(tp, detail::collective_kind::allgatherv);
    auto const block = [&](rank_t i) {
        return recv.subspan(displs[static_cast<std::size_t>(i)], counts[static_cast<std::size_t>(i)]);
    };
    detail::copy_part<typename Transport::memory_space>(block(me), send, recv.size_bytes());
    detail::ring_allgather_steps(tp, tag, me, block, [](rank_t u, rank_t i) { return u == i; });
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::allgatherv, ring> = [](auto&... a) { ring_allgatherv(a...); };
}

} // namespace chorus
