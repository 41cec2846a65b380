// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Zero-copy alltoall over an exposing_transport (ranks that read each other's buffers where
// they lie: CUDA IPC; shm_transport, in registered shm_buffers).
// Schedule: two rounds, no message.
//   1. Every rank exposes its `send` (p blocks of n elements); each copies block `me` of every
//      peer's from where it lies into place (its own from `send`).
//   2. An empty round: no rank returns, and lets its caller write or free `send`, while a peer
//      may still read it (each closes the peers' allocations once its reads completed, before
//      it announces this round).
// Cost: 2 delta + (p - 1) * n * beta, every rank at once, each block read once, where pairwise
// copies every block twice (into the receiver's FIFO, then into place) behind a host round
// trip, and one_shot copies all p blocks into its slot first, in rounds of the slot's size.
// Where a rank's `send` cannot be exposed (memory its device cannot export), every rank learns
// it in round 1 and the schedule of messages runs instead (pairwise, or bruck for many ranks
// and tiny blocks: detail/select.hpp).

#include <cstddef>
#include <span>

#include <chorus/algorithm/bruck_alltoall.hpp>
#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/direct.hpp>
#include <chorus/algorithm/pairwise_alltoall.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/detail/select.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Block j of rank i's `send` lands in block i of rank j's `recv`.
template <exposing_transport Transport, class T>
void zero_copy_alltoall(Transport& tp, std::span<T const> send, std::span<T> recv) {
    using space = typename Transport::memory_space;
    detail::check_alltoall_blocks(tp, send.size(), recv.size());
    rank_t const me = tp.rank(), p = tp.size();
    std::size_t const n = send.size() / static_cast<std::size_t>(p);
    detail::direct_rounds round(tp, detail::collective_kind::alltoall, send.size_bytes());
    if (!round.expose(detail::bytes_of(send))) {
        if (detail::choose_alltoall(p, n * sizeof(T)).algorithm == bruck::name) return bruck_alltoall(tp, send, recv);
        return pairwise_alltoall(tp, send, recv);
    }
    for (rank_t r = 0; r < p; ++r)
        detail::copy_part<space>(detail::slot(recv, r, n),
                                 r == me ? detail::slot(send, me, n) : detail::direct_block<T>(tp, r, static_cast<std::size_t>(me) * n, n),
                                 recv.size_bytes());
    round.end();
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::alltoall, zero_copy> = [](auto&... a) { zero_copy_alltoall(a...); };
}

} // namespace chorus
