// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// One-shot allgather over a direct_transport (ranks that read each other's memory).
// Schedule: rounds of the direct exchange, each of at most D bytes (the transport's
// direct_bytes), in which every rank publishes the next part of its block; each then copies
// the p - 1 others' parts into place (its own from `send`).
// Cost: R delta (R = ceil(nb / D)) + n * beta (the publish) + (p - 1) * n * beta, every rank at
// once, against the ring's p - 1 or Bruck's log2 p messages in sequence. For small blocks.
//
// Over a signaling_transport, a block of up to signal_bytes() takes one launch instead
// (transport/signals.hpp): each lane copies its share of the block into this rank's slot,
// signals, waits, then copies the same share of every rank's slot into place; no host round trip.

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
// The lanes of a signaled one_shot allgather (every block read from its slot, this rank's too:
// `send` may lie inside `recv`).
template <class T>
struct one_shot_allgather_lanes {
    T const* send;
    T* recv;
    std::size_t n;

    template <class Channel>
    CHORUS_HOST_DEVICE void operator()(Channel& c) const {
        lane_span const share = lane_share(n, c.lane(), c.lanes());
        lane_copy(c, share, send, reinterpret_cast<T*>(c.own()));
        if (!c.barrier(0)) return;
        for (rank_t r = 0; r < c.size(); ++r)
            lane_copy(c, share, reinterpret_cast<T const*>(c.slot(r)), recv + static_cast<std::size_t>(r) * n);
    }
};
} // namespace detail

/// Every rank receives every rank's `send` into `recv`, in rank order.
template <direct_transport Transport, class T>
void one_shot_allgather(Transport& tp, std::span<T const> send, std::span<T> recv) {
    using space = typename Transport::memory_space;
    detail::check_blocks(tp, "allgather", "recv", recv.size(), "send.size()", send.size());
    if (detail::launch_signaled(tp, detail::collective_kind::allgather, send.size_bytes(), -1,
                                detail::one_shot_allgather_lanes<T>{send.data(), recv.data(), send.size()}))
        return;
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
