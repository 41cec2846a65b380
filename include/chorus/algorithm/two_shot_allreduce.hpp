// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Two-shot allreduce over an exposing_transport (ranks that read each other's buffers where
// they lie: CUDA IPC; shm_transport, in registered shm_buffers). The vector is cut into p slices, slice r of about n / p elements.
// Schedule: three rounds, no message.
//   1. Every rank exposes its vector; each folds slice `me` of all p, in rank order, into its
//      own (the reduce-scatter half).
//   2. Every rank exposes it again, its slice now reduced; each copies the p - 1 others'
//      slices from their vectors into place (the allgather half).
//   3. An empty round: no rank returns, and lets its caller write or free the vector, while a
//      peer may still read it or hold its allocation open (each closes the peers' allocations
//      it opened once its reads completed, before it announces this round).
// In place is safe: in round 1 rank r writes only slice r, which only r reads then; in round 2
// it writes slice s, which only s read, in round 1, and s announced round 2 only once its reads
// of round 1 completed.
// Cost: 3 delta + (p - 1) / p * n * (beta + gamma) (the fold's reads from the peers; its own
// slice from its own memory) + (p - 1) / p * n * beta (the gather): about 2n bytes read per
// rank, each byte crossing once, where the ring moves as many in 2 (p - 1) steps that each
// copy a chunk twice (into the receiver's FIFO, then into place) behind a host round trip,
// and one_shot reads p n. Every rank folds the same operands in the same order: results agree
// bit for bit, non-commutative ops are served.
// Where a rank's vector cannot be exposed (memory its device cannot export; over shm_transport,
// memory outside a registered shm_buffer), every rank learns it in round 1 and the messages
// run instead, those the automatic choice takes (recursive doubling, Rabenseifner's, the ring;
// never the ring for an op that does not commute).

#include <cstddef>
#include <span>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/direct.hpp>
#include <chorus/algorithm/rabenseifner_allreduce.hpp>
#include <chorus/algorithm/recursive_doubling_allreduce.hpp>
#include <chorus/algorithm/ring_allreduce.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/detail/select.hpp>
#include <chorus/reduce/concepts.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Reduces `data` element-wise over all ranks with `op`, in place, on every rank.
template <exposing_transport Transport, class T, reduce_op<T> Op>
void two_shot_allreduce(Transport& tp, std::span<T> data, Op op) {
    using space = typename Transport::memory_space;
    detail::direct_rounds round(tp, detail::collective_kind::allreduce, data.size_bytes());
    if (!round.expose(detail::bytes_of(data))) {  // nobody reads an empty block: no closing round
        // The messages the automatic choice sends (never the ring for an op that does not commute).
        auto const other = detail::choose_allreduce(tp.size(), data.size_bytes(), is_commutative_v<Op, T>).algorithm;
        if (other == recursive_doubling::name) return recursive_doubling_allreduce(tp, data, op);
        if constexpr (is_commutative_v<Op, T>)
            if (other == ring::name) return ring_allreduce(tp, data, op);
        return rabenseifner_allreduce(tp, data, op);
    }
    auto const p = static_cast<std::size_t>(tp.size()), me = static_cast<std::size_t>(tp.rank()), n = data.size();
    auto const first = [&](std::size_t r) { return r * n / p; };
    auto const slice = [&](std::size_t r) { return data.subspan(first(r), first(r + 1) - first(r)); };
    std::span<T> const mine = slice(me);
    if (detail::folds_in_one_pass<space, T, Op>(tp.size())) {
        detail::direct_fold(tp, detail::as_const(mine), mine, first(me), op);  // reads all operands, then writes
    } else {
        // Pairwise steps would overwrite this rank's slice before reading it, and the peers'
        // view of it is the same memory: the fold goes through scratch.
        typename space::template buffer<T> folded(mine.size());
        detail::direct_fold(tp, detail::as_const(mine), folded.span(), first(me), op);
        detail::copy_part<space>(mine, detail::as_const(folded.span()), data.size_bytes());
    }
    // The same buffers again: each rank re-sends its round-1 export, so every rank's is readable.
    if (!round.expose(detail::bytes_of(data))) detail::fail_argument(tp, "two_shot allreduce: a vector exposed in round 1 was not in round 2");
    for (std::size_t r = 0; r < p; ++r)
        if (r != me)
            detail::copy_part<space>(slice(r), detail::direct_block<T>(tp, static_cast<rank_t>(r), first(r), slice(r).size()),
                                     data.size_bytes());
    round.end();
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::allreduce, two_shot> = [](auto&... a) { two_shot_allreduce(a...); };
template <collective_kind K, class T, class Op>
inline constexpr bool schedule_applies<K, two_shot, T, Op> = direct_aligned<T>();
template <class Transport>
inline constexpr bool schedule_serves<two_shot, Transport> = exposing_transport<Transport>;
}

} // namespace chorus
