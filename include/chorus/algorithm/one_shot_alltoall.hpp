// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// One-shot alltoall over a direct_transport (ranks that read each other's memory).
// Schedule: rounds of the direct exchange, each of at most D bytes (the transport's
// direct_bytes), in which every rank publishes the next part of each of its p blocks; each
// then copies part `me` of every rank's into place.
// Cost: R delta (R = ceil(p nb / D)) + p * n * beta (the publish) + (p - 1) * n * beta, every
// rank at once, against pairwise's p - 1 messages. For small blocks: a rank publishes p.

#include <algorithm>
#include <cstddef>
#include <span>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/direct.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Block j of rank i's `send` lands in block i of rank j's `recv`.
template <direct_transport Transport, class T>
void one_shot_alltoall(Transport& tp, std::span<T const> send, std::span<T> recv) {
    using space = typename Transport::memory_space;
    detail::check_alltoall_blocks(tp, send.size(), recv.size());
    rank_t const me = tp.rank(), p = tp.size();
    std::size_t const n = send.size() / static_cast<std::size_t>(p);
    detail::direct_rounds round(tp, detail::collective_kind::alltoall, send.size_bytes());
    std::size_t const k = round.per_round(sizeof(T), static_cast<std::size_t>(p));
    detail::direct_pieces pieces(static_cast<std::size_t>(p));
    for (std::size_t c = 0, rounds = detail::direct_round_count(n, k); c < rounds; ++c) {
        std::size_t const len = std::min(k, n - c * k);  // of every block, this round
        for (rank_t r = 0; r < p; ++r) pieces[static_cast<std::size_t>(r)] = detail::bytes_of(detail::slot(send, r, n).subspan(c * k, len));
        round(pieces.all());
        for (rank_t r = 0; r < p; ++r)
            space::copy(detail::slot(recv, r, n).subspan(c * k, len),
                        r == me ? detail::slot(send, me, n).subspan(c * k, len)
                                : detail::direct_block<T>(tp, r, static_cast<std::size_t>(me) * len, len));
    }
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::alltoall, one_shot> = [](auto&... a) { one_shot_alltoall(a...); };
}

} // namespace chorus
