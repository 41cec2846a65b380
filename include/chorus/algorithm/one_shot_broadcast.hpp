// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// One-shot broadcast over a direct_transport (ranks that read each other's memory).
// Schedule: rounds of the direct exchange, each of at most D bytes (the transport's
// direct_bytes), in which the root publishes the next part of the vector and the other ranks
// publish nothing; each of them then copies the root's part into its own vector.
// Cost: R delta (R = ceil(nb / D)) + n * beta at the root + n * beta at every other rank, at
// once: one round against the binomial tree's log2 p messages in sequence. For small vectors:
// all p - 1 ranks read the root's memory at the same time. Over a rooted_transport (shm) no
// rank waits for more than the root: the root returns once its part is published, as an MPI
// root whose message fits the receivers' eager buffers does (a receiver's failure then reaches
// it at its next collective), and a late rank delays nobody.
//
// Over a signaling_transport, a vector of up to signal_bytes() takes one launch instead
// (transport/signals.hpp): the root's lanes copy their shares into its slot and signal, the
// others' lanes wait and copy the same shares out; no host round trip.

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
// The lanes of a signaled one_shot broadcast.
template <class T>
struct one_shot_broadcast_lanes {
    T* data;
    std::size_t n;
    rank_t root;

    template <class Channel>
    CHORUS_HOST_DEVICE void operator()(Channel& c) const {
        lane_span const share = lane_share(n, c.lane(), c.lanes());
        if (c.rank() == root) lane_copy(c, share, static_cast<T const*>(data), reinterpret_cast<T*>(c.own()));
        if (!c.barrier(0) || c.rank() == root) return;
        lane_copy(c, share, reinterpret_cast<T const*>(c.slot(root)), data);
    }
};
} // namespace detail

/// Copies `data` from `root` to every rank, in place.
template <direct_transport Transport, class T>
void one_shot_broadcast(Transport& tp, std::span<T> data, rank_t root) {
    detail::check_root(tp, root, "broadcast");
    if (detail::launch_signaled(tp, detail::collective_kind::broadcast, data.size_bytes(), root,
                                detail::one_shot_broadcast_lanes<T>{data.data(), data.size(), root}))
        return;
    rank_t const me = tp.rank();
    detail::direct_rounds round(tp, detail::collective_kind::broadcast, data.size_bytes(), root);
    std::size_t const k = round.per_round(sizeof(T));
    for (std::size_t c = 0, rounds = detail::direct_round_count(data.size(), k); c < rounds; ++c) {
        std::span<T> const part = data.subspan(c * k, std::min(k, data.size() - c * k));
        round.from(me == root ? detail::bytes_of(part) : std::span<std::byte const>(), root);
        if (me != root) Transport::memory_space::copy(part, detail::direct_block<T>(tp, root));
    }
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::broadcast, one_shot> = [](auto&... a) { one_shot_broadcast(a...); };
}

} // namespace chorus
