// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// One-shot reduce_scatter over a direct_transport (ranks that read each other's memory).
// Schedule: rounds of the direct exchange, each of at most D bytes (the transport's
// direct_bytes), in which every rank publishes the next part of each of its p blocks; each
// then folds part `me` of every rank's, in rank order, into its receive buffer.
// Cost: R delta (R = ceil(p nb / D)) + p * n * beta (the publish) + (p - 1) * n * (beta +
// gamma), every rank at once, against the ring's p - 1 messages. For small blocks. Rank
// order: any op.
//
// Over a signaling_transport, a send vector of up to signal_bytes() takes one launch instead
// (transport/signals.hpp): each lane copies its share of every block into this rank's slot,
// signals, waits, then folds the same share of block `me` of every rank's slot in rank order,
// the op's finish included; no host round trip.
// Cost: one launch, 2 delta of flags on the device, p * n * beta (the publish) + (p - 1) * n *
// (beta + gamma).

#include <algorithm>
#include <cstddef>
#include <span>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/direct.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/reduce/concepts.hpp>
#include <chorus/transport/concepts.hpp>
#include <chorus/transport/signals.hpp>

namespace chorus {

namespace detail {
// The lanes of a signaled one_shot reduce_scatter. A lane reads only its share of each block of
// `send` before the barrier and writes only its share of `recv` after it, so `recv` may be one
// of `send`'s blocks.
template <class T, class Op>
struct one_shot_reduce_scatter_lanes {
    T const* send;
    T* recv;
    std::size_t n;  // elements per block
    Op op;

    template <class Channel>
    CHORUS_HOST_DEVICE void operator()(Channel& c) const {
        lane_span const share = lane_share(n, c.lane(), c.lanes());
        lane_publish_blocks(c, share, send, n);
        if (!c.barrier(0)) return;
        lane_fold(c, share, static_cast<std::size_t>(c.rank()) * n, recv, op);
    }
};
} // namespace detail

/// Reduces every rank's `send` (p blocks of recv.size() elements) with `op`; rank r receives
/// the reduction of block r.
template <direct_transport Transport, class T, reduce_op<T> Op>
void one_shot_reduce_scatter(Transport& tp, std::span<T const> send, std::span<T> recv, Op op) {
    detail::check_blocks(tp, "reduce_scatter", "send", send.size(), "recv.size()", recv.size());
    if (detail::launch_signaled(tp, detail::collective_kind::reduce_scatter, send.size_bytes(), -1,
                                detail::one_shot_reduce_scatter_lanes<T, Op>{send.data(), recv.data(), recv.size(), op}))
        return;
    rank_t const me = tp.rank();
    std::size_t const n = recv.size();
    detail::direct_block_rounds(tp, detail::collective_kind::reduce_scatter, send, n, [&](std::size_t first, std::size_t len) {
        detail::direct_fold(tp, detail::slot(send, me, n).subspan(first, len), recv.subspan(first, len),
                            static_cast<std::size_t>(me) * len, op);
    });
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::reduce_scatter, one_shot> =
    [](auto&... a) { one_shot_reduce_scatter(a...); };
}

} // namespace chorus
