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
    detail::direct_block_rounds(tp, detail::collective_kind::alltoall, send, n, [&](std::size_t first, std::size_t len) {
        for (rank_t r = 0; r < p; ++r)
            space::copy(detail::slot(recv, r, n).subspan(first, len),
                        r == me ? detail::slot(send, me, n).subspan(first, len)
                                : detail::direct_block<T>(tp, r, static_cast<std::size_t>(me) * len, len));
    });
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::alltoall, one_shot> = [](auto&... a) { one_shot_alltoall(a...); };
}

} // namespace chorus
