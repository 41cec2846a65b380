// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Zero-copy reduce_scatter over an exposing_transport (ranks that read each other's buffers
// where they lie: CUDA IPC; shm_transport, in registered shm_buffers).
// Schedule: two rounds, no message.
//   1. Every rank exposes its `send` (p blocks of n elements); each folds block `me` of all p,
//      in rank order, into its `recv` (on a device that folds many operands at once, one
//      kernel reading every peer's memory: detail::folding_space).
//   2. An empty round: no rank returns, and lets its caller write or free `send`, while a peer
//      may still read it (each closes the peers' allocations once its reads completed, before
//      it announces this round).
// Cost: 2 delta + (p - 1) * n * (beta + gamma), every rank at once, each byte of the input
// read once, where the ring takes p - 1 steps in sequence that each copy a block twice behind
// a host round trip and reduce it in a kernel of its own.
// Every rank folds its block's operands in rank order: non-commutative ops are served. Where a
// rank's `send` cannot be exposed (memory its device cannot export), every rank learns it in
// round 1 and the ring runs instead (the tree for an op that does not commute).

#include <cstddef>
#include <span>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/direct.hpp>
#include <chorus/algorithm/ring_reduce_scatter.hpp>
#include <chorus/algorithm/tree_reduce_scatter.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/reduce/concepts.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Reduces every rank's `send` (p blocks of recv.size() elements) with `op`; rank r receives
/// the reduction of block r.
template <exposing_transport Transport, class T, reduce_op<T> Op>
void zero_copy_reduce_scatter(Transport& tp, std::span<T const> send, std::span<T> recv, Op op) {
    detail::check_blocks(tp, "reduce_scatter", "send", send.size(), "recv.size()", recv.size());
    detail::direct_rounds round(tp, detail::collective_kind::reduce_scatter, send.size_bytes());
    if (!round.expose(detail::bytes_of(send))) {
        if constexpr (is_commutative_v<Op, T>) return ring_reduce_scatter(tp, send, recv, op);
        else return tree_reduce_scatter(tp, send, recv, op);  // keeps rank order
    }
    std::size_t const n = recv.size(), me = static_cast<std::size_t>(tp.rank());
    detail::direct_fold(tp, detail::slot(send, tp.rank(), n), recv, me * n, op);
    round.end();
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::reduce_scatter, zero_copy> =
    [](auto&... a) { zero_copy_reduce_scatter(a...); };
}

} // namespace chorus
