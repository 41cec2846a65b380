// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// One-shot allreduce over a direct_transport (ranks that read each other's memory).
// Schedule: rounds of the direct exchange, each of at most D bytes (the transport's
// direct_bytes): every rank publishes the next part of its vector in its own memory; once all
// have, each folds the p parts in rank order into its own, reading its peers' where they lie
// (its own from its buffer, not from the published copy).
// Cost: R delta (R = ceil(nb / D) rounds, a flag per peer each) + n * beta (the publish) +
// (p - 1) * n * (beta + gamma), every rank at once: on one host one round is a cache line each
// way, against recursive doubling's log2 p messages, each a record written, read and matched.
// For small vectors (the reads grow with p, where the ring's stay flat). Every rank combines
// the same operands in the same order: results agree bit for bit, non-commutative ops are
// served.
//
// Over a signaling_transport (CUDA IPC with MPS or a GPU per rank), a vector of up to
// signal_bytes() takes one launch instead: each lane (a block of threads) copies its share into
// this rank's slot, signals its peers' lanes and waits for theirs through flags in device memory,
// then folds every rank's share in rank order, the op's finish included (transport/signals.hpp).
// Cost: one kernel launch, 2 delta of flags on the device, n * beta + (p - 1) * n * (beta + gamma);
// the host waits for nothing, so a CUDA graph can capture it.

#include <algorithm>
#include <cstddef>
#include <span>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/direct.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/reduce/concepts.hpp>
#include <chorus/reduce/traits.hpp>
#include <chorus/transport/concepts.hpp>
#include <chorus/transport/signals.hpp>

namespace chorus {

namespace detail {
// The lanes of a signaled one_shot allreduce, in place or from `in` to `out`.
template <class T, class Op>
struct one_shot_allreduce_lanes {
    T const* in;
    T* out;
    std::size_t n;
    Op op;

    template <class Channel>
    CHORUS_HOST_DEVICE void operator()(Channel& c) const {
        lane_span const share = lane_share(n, c.lane(), c.lanes());
        lane_copy(c, share, in, reinterpret_cast<T*>(c.own()));
        if (!c.barrier(0)) return;
        lane_fold(c, share, 0, out, op);
    }
};
} // namespace detail

/// Reduces `data` element-wise over all ranks with `op`, in place, on every rank.
template <direct_transport Transport, class T, reduce_op<T> Op>
void one_shot_allreduce(Transport& tp, std::span<T> data, Op op) {
    if (detail::launch_signaled(tp, detail::collective_kind::allreduce, data.size_bytes(), -1,
                                detail::one_shot_allreduce_lanes<T, Op>{data.data(), data.data(), data.size(), op}))
        return;
    detail::direct_rounds round(tp, detail::collective_kind::allreduce, data.size_bytes());
    std::size_t const k = round.per_round(sizeof(T));
    for (std::size_t c = 0, rounds = detail::direct_round_count(data.size(), k); c < rounds; ++c) {
        std::span<T> const part = data.subspan(c * k, std::min(k, data.size() - c * k));
        round(detail::bytes_of(part));
        detail::direct_fold(tp, detail::as_const(part), part, 0, op);
    }
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::allreduce, one_shot> = [](auto&... a) { one_shot_allreduce(a...); };
}

} // namespace chorus
