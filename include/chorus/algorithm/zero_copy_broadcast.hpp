// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Zero-copy broadcast over an exposing_transport (ranks that read each other's buffers where
// they lie: CUDA IPC; shm_transport, in registered shm_buffers).
// Schedule: two rounds, no message.
//   1. The root exposes its vector (the others an empty block); every other rank copies it
//      into its own, all of them at once.
//   2. An empty round: the root does not return, and let its caller write or free the vector,
//      while a peer may still read it (each closes the root's allocation once its read
//      completed, before it announces this round).
// Cost: 2 delta + n * beta, every rank reading at once: (p - 1) n bytes out of the root's
// memory, each once, where the tree sends the vector ceil(log2 p) times along its critical
// path and copies every chunk twice (into the receiver's FIFO, then into place).
// Where the root's vector cannot be exposed (memory its device cannot export), every rank
// learns it in round 1 and the schedule of messages runs instead (tree, or scatter_allgather
// for large vectors on many ranks: detail/select.hpp).

#include <cstddef>
#include <span>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/direct.hpp>
#include <chorus/algorithm/scatter_allgather_broadcast.hpp>
#include <chorus/algorithm/tree_broadcast.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/detail/select.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Copies `data` from `root` to every rank, in place.
template <exposing_transport Transport, class T>
void zero_copy_broadcast(Transport& tp, std::span<T> data, rank_t root) {
    detail::check_root(tp, root, "broadcast");
    rank_t const me = tp.rank();
    detail::direct_rounds round(tp, detail::collective_kind::broadcast, data.size_bytes(), root);
    // Only the root's block is read: the others expose nothing, so that their memory need not
    // be exportable.
    if (!round.expose(me == root ? detail::bytes_of(std::span<T const>(data)) : std::span<std::byte const>())) {
        if (detail::choose_broadcast(tp.size(), data.size_bytes()).algorithm == scatter_allgather::name)
            return scatter_allgather_broadcast(tp, data, root);
        return tree_broadcast(tp, data, root);
    }
    if (me != root) Transport::memory_space::copy(data, detail::direct_block<T>(tp, root));
    round.end();
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::broadcast, zero_copy> = [](auto&... a) { zero_copy_broadcast(a...); };
}

} // namespace chorus
