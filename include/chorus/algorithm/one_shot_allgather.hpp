// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// One-shot allgather over a direct_transport (ranks that read each other's memory).
// Schedule: rounds of the direct exchange, each of at most D bytes (the transport's
// direct_bytes), in which every rank publishes the next part of its block; each then copies
// the p - 1 others' parts into place (its own from `send`).
// Cost: R delta (R = ceil(nb / D)) + n * beta (the publish) + (p - 1) * n * beta, every rank at
// once, against the ring's p - 1 or Bruck's log2 p messages in sequence. For small blocks.

#include <algorithm>
#include <cstddef>
#include <span>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/direct.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Every rank receives every rank's `send` into `recv`, in rank order.
template <direct_transport Transport, class T>
void one_shot_allgather(Transport& tp, std::span<T const> send, std::span<T> recv) {
    using space = typename Transport::memory_space;
    detail::check_blocks(tp, "allgather", "recv", recv.size(), "send.size()", send.size());
    detail::direct_rounds round(tp, detail::collective_kind::allgather, send.size_bytes());
    std::size_t const k = round.per_round(sizeof(T)), n = send.size();
    rank_t const me = tp.rank();
    for (std::size_t c = 0, rounds = detail::direct_round_count(n, k); c < rounds; ++c) {
        std::size_t const len = std::min(k, n - c * k);
        std::span<T const> const piece = send.subspan(c * k, len);
        round(detail::bytes_of(piece));
        for (rank_t r = 0; r < tp.size(); ++r)
            space::copy(detail::slot(recv, r, n).subspan(c * k, len), r == me ? piece : detail::direct_block<T>(tp, r));
    }
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::allgather, one_shot> = [](auto&... a) { one_shot_allgather(a...); };
}

} // namespace chorus
