// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Zero-copy allgather over an exposing_transport (ranks that read each other's buffers where
// they lie: CUDA IPC; shm_transport, in registered shm_buffers).
// Schedule: two rounds, no message.
//   1. Every rank exposes its block; each copies the p - 1 others' from where they lie into
//      place (its own from `send`).
//   2. An empty round: no rank returns, and lets its caller write or free its block, while a
//      peer may still read it (each closes the peers' allocations once its reads completed,
//      before it announces this round).
// Cost: 2 delta + (p - 1) * n * beta, every rank at once, each block read once by each peer,
// where the ring takes p - 1 steps in sequence that each copy a block twice (into the
// receiver's FIFO, then into place) behind a host round trip, and one_shot copies every block
// into its slot first, in rounds of the slot's size.
// Where a rank's block cannot be exposed (memory its device cannot export), every rank learns
// it in round 1 and the schedule of messages runs instead (ring, or bruck for small totals:
// detail/select.hpp).

#include <cstddef>
#include <span>

#include <chorus/algorithm/bruck_allgather.hpp>
#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/direct.hpp>
#include <chorus/algorithm/ring_allgather.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/detail/select.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Every rank receives every rank's `send` into `recv`, in rank order.
template <exposing_transport Transport, class T>
void zero_copy_allgather(Transport& tp, std::span<T const> send, std::span<T> recv) {
    using space = typename Transport::memory_space;
    detail::check_blocks(tp, "allgather", "recv", recv.size(), "send.size()", send.size());
    detail::direct_rounds round(tp, detail::collective_kind::allgather, send.size_bytes());
    if (!round.expose(detail::bytes_of(send))) {
        if (detail::choose_allgather(tp.size(), recv.size_bytes()).algorithm == bruck::name) return bruck_allgather(tp, send, recv);
        return ring_allgather(tp, send, recv);
    }
    std::size_t const n = send.size();
    for (rank_t r = 0; r < tp.size(); ++r)
        detail::copy_part<space>(detail::slot(recv, r, n), r == tp.rank() ? send : detail::direct_block<T>(tp, r, 0, n),
                                 recv.size_bytes());
    round.end();
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::allgather, zero_copy> = [](auto&... a) { zero_copy_allgather(a...); };
}

} // namespace chorus
