// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// One-shot alltoall over a direct_transport (ranks that read each other's memory).
// Schedule: rounds of the direct exchange, each of at most D bytes (the transport's
// direct_bytes), in which every rank publishes the next part of each of its p blocks; each
// then copies part `me` of every rank's into place.
// Cost: R delta (R = ceil(p nb / D)) + p * n * beta (the publish) + (p - 1) * n * beta, every
// rank at once, against pairwise's p - 1 messages. For small blocks: a rank publishes p.
//
// Over a signaling_transport, a send vector of up to signal_bytes() takes one launch instead
// (transport/signals.hpp): each lane copies its share of every block into this rank's slot,
// signals, waits, then copies the same share of block `me` of every rank's slot into place
// (its own too, from its slot); no host round trip.
// Cost: one launch, 2 delta of flags on the device, p * n * beta (the publish) + p * n * beta.

#include <algorithm>
#include <cstddef>
#include <span>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/direct.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/transport/concepts.hpp>
#include <chorus/transport/signals.hpp>

namespace chorus {

namespace detail {
// The lanes of a signaled one_shot alltoall. A lane reads only its share of each block of
// `send` before the barrier and writes only its share of each block of `recv` after it.
template <class T>
struct one_shot_alltoall_lanes {
    T const* send;
    T* recv;
    std::size_t n;  // elements per block

    template <class Channel>
    CHORUS_HOST_DEVICE void operator()(Channel& c) const {
        lane_span const share = lane_share(n, c.lane(), c.lanes());
        lane_publish_blocks(c, share, send, n);
        if (!c.barrier(0)) return;
        std::size_t const mine = static_cast<std::size_t>(c.rank()) * n;
        for (rank_t r = 0; r < c.size(); ++r)
            lane_copy(c, share, reinterpret_cast<T const*>(c.slot(r)) + mine, recv + static_cast<std::size_t>(r) * n);
    }
};
} // namespace detail

/// Block j of rank i's `send` lands in block i of rank j's `recv`.
template <direct_transport Transport, class T>
void one_shot_alltoall(Transport& tp, std::span<T const> send, std::span<T> recv) {
    using space = typename Transport::memory_space;
    detail::check_alltoall_blocks(tp, send.size(), recv.size());
    rank_t const me = tp.rank(), p = tp.size();
    std::size_t const n = send.size() / static_cast<std::size_t>(p);
    if (detail::launch_signaled(tp, detail::collective_kind::alltoall, send.size_bytes(), -1,
                                detail::one_shot_alltoall_lanes<T>{send.data(), recv.data(), n}))
        return;
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
