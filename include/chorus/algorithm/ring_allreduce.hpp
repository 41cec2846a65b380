// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Ring allreduce = ring reduce-scatter + ring allgather (the seed's 2.4 and section 3),
// pipelined in segments.
// Blocks: the vector is cut into p near-equal blocks. Reduce-scatter: in step
// s = 0 .. p-2 rank r sends block (r - s) to its right neighbour and reduces the block
// (r - s - 1) arriving from its left neighbour into its own copy; after step s that block
// holds s + 2 contributions, so after p - 1 steps rank r owns the full reduction of block
// r + 1. Allgather: steps s = p-1 .. 2p-3 pass the reduced blocks around the ring, each
// received straight into place. In every one of the 2(p-1) steps rank r sends block r - s
// and receives block r - s - 1 (mod p), and what it receives in step s is what it sends in
// step s + 1.
// Segments: every block is cut into the same number k of near-equal segments, k =
// ceil(largest block / S) for a segment of S elements (detail::ring_segment_bytes_of: 256 KiB,
// or what the transport asks for; at least one element), so a vector of at most p * S
// elements is one segment per block and the schedule is exactly the unsegmented ring.
// Chunk c = s * k + j is segment j of step s.
// Pipeline: chunk c is forwarded as chunk c + k the moment it has been received (and, in
// the reduce-scatter, reduced; in step p-2 also finalized), while the receives of the next
// W - 1 chunks (W = detail::ring_window) are already posted into W scratch slots of one
// segment each and up to W sends are in flight. So the transfer of segment j + 1 overlaps
// the reduction of segment j and the send of segment j - 1, and a transport that makes
// progress only inside wait() always has the next messages posted while it waits. Scratch:
// W segments (allocated once per call), not a block, and no allocation per step or segment.
// An allgather receive lands where the same segment was sent from p - 1 steps earlier. The
// ring's causality already orders the two (the left neighbour can only send chunk c after
// the right neighbour received chunk c - (p-1)k, the send from that place), but the
// receive is also posted only once that send's request completed, so the buffer rule holds
// by construction; that wait normally returns at once.
// Cost: 2(p-1) k * alpha + 2 (p-1)/p * n * beta + (p-1)/p * n * gamma in total work, but
// with W messages in flight and reductions overlapping transfers the critical path is about
// (2(p-1) + k - 1)(alpha + n/(pk) * beta) + (p-1) * n/(pk) * gamma: the latency term grows
// from 2(p-1) to 2(p-1)k messages (k = 1 below p * S elements, so small vectors pay
// nothing), while only one segment's reduction per step stays exposed instead of a block's.
// Each rank moves 2(p-1)/p of the vector, which tends to 2n however large p grows
// (bandwidth-optimal). Contributions to a block are combined starting at different ranks,
// so the op must be commutative; every element is reduced once, in the same order as the
// unsegmented ring, and copied, so all ranks end with identical bits.

#include <algorithm>
#include <cstddef>
#include <span>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/reduce/concepts.hpp>
#include <chorus/topology/ring.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

namespace detail {

// Chunks in flight each way; also the number of scratch segments.
inline constexpr std::size_t ring_window = 4;

// Elements per segment over `tp`: ring_segment_bytes_of (transport/concepts.hpp; 256 KiB unless
// the transport asks for another size: TCP's messages cost more, the device's more again).
template <class T, class Transport>
std::size_t ring_segment_elements(Transport const& tp) noexcept {
    return std::max<std::size_t>(1, ring_segment_bytes_of(tp) / sizeof(T));
}

/// ring_allreduce with `segment` elements per segment (at least 1) and `window` chunks in
/// flight (at least 1); tests pass tiny values to exercise the pipeline on small vectors.
/// Every rank must pass the same `segment` (it decides the message sizes).
template <transport Transport, class T, class Op>
void ring_allreduce_segmented(Transport& tp, std::span<T> data, Op const& op, std::size_t segment,
                              std::size_t window) {
    tag_t const tag = begin_collective(tp, collective_kind::allreduce);
    using space = typename Transport::memory_space;
    rank_t const p = tp.size();
    rank_t const me = tp.rank();
    if (p == 1) return space::finalize(data, op, p);
    auto const parts = static_cast<std::size_t>(p);
    std::size_t const largest = (data.size() + parts - 1) / parts;  // block p - 1's size
    segment = std::max<std::size_t>(1, segment);
    std::size_t const k = std::max<std::size_t>(1, (largest + segment - 1) / segment);
    std::size_t const reducing = (parts - 1) * k;  // chunks of the reduce-scatter
    std::size_t const total = 2 * reducing;
    // The window never exceeds the reduce-scatter: an allgather receive may need the send
    // `reducing` chunks before it to have completed, which must then already be started.
    std::size_t const w = std::clamp<std::size_t>(window, 1, reducing);
    std::size_t const slot_size = (largest + k - 1) / k;  // the largest segment

    auto const chunk = [&](std::size_t c, rank_t shift) {
        auto const step = static_cast<rank_t>(c / k);
        auto const b = block(data, ring_index(me - step - shift, p), parts);
        return block(b, c % k, k);
    };
    auto const outgoing = [&](std::size_t c) { return as_const(chunk(c, 0)); };
    auto const incoming = [&](std::size_t c) { return chunk(c, 1); };

    typename space::template buffer<T> scratch(w * slot_size);  // before the requests: outlives them
    auto const slot = [&](std::size_t c) {
        return scratch.span().subspan((c % w) * slot_size, incoming(c).size());
    };
    ring_topology const ring(p);
    request_window<typename Transport::request> sends(w), recvs(w);
    std::size_t posted = 0;  // receives posted: chunks [done, posted) are in flight
    std::size_t issued = 0;  // sends started: chunks [issued - sends.size(), issued) in flight

    // Posts the receives of chunks [posted, done + w): a free scratch slot each in the
    // reduce-scatter, the segment's place in the allgather once its earlier send left.
    auto const post = [&](std::size_t done) {
        for (; posted < total && posted < done + w; ++posted) {
            if (posted < reducing) {
                recvs.push(tp.irecv(ring.left(me), tag, writable_bytes_of(slot(posted))));
                continue;
            }
            std::size_t const earlier = posted - reducing;  // sent from the same segment
            if (earlier >= issued) break;                     // not started yet: post later
            while (issued - sends.size() <= earlier) sends.wait_front();
            recvs.push(tp.irecv(ring.left(me), tag, writable_bytes_of(incoming(posted))));
        }
    };
    // Starts the sends of chunks [issued, done + min(k, w)): chunk c >= k is chunk c - k,
    // received (and reduced) by now; no more than w ahead of the receives, which is what the
    // right neighbour has posted.
    auto const start_sends = [&](std::size_t done) {
        for (; issued < total && issued < done + std::min(k, w); ++issued) {
            if (sends.full()) sends.wait_front();
            sends.push(tp.isend(ring.right(me), tag, bytes_of(outgoing(issued))));
        }
    };

    // Deadlock-free with blocking waits on both sides: a rank waiting for a receive has
    // started every send it may, and a send or receive it waits for is one its neighbour
    // has posted or will post after making progress of its own (all ranks run this loop).
    post(0);
    for (std::size_t done = 0; done < total; ++done) {
        start_sends(done);
        post(done);
        recvs.wait_front();  // chunk `done`
        if (done < reducing) {
            auto const acc = incoming(done);
            space::reduce(acc, as_const(slot(done)), op, /*in_first=*/true);
            // The last reduce-scatter step completes block me + 1: finalize it before it travels.
            if (done / k == parts - 2) space::finalize(acc, op, p);
        }
    }
    sends.wait_all();
}

} // namespace detail

/// Reduces `data` element-wise over all ranks with the commutative `op`, in place.
/// Collective: every rank passes the same data.size() and an equivalent op.
template <transport Transport, class T, reduce_op<T> Op>
void ring_allreduce(Transport& tp, std::span<T> data, Op op) {
    static_assert(is_commutative_v<Op, T>,
                  "ring_allreduce combines contributions in ring order, which needs a commutative op: "
                  "wrap a commutative function in chorus::commutative(f), or use tree_allreduce, "
                  "recursive_doubling_allreduce or rabenseifner_allreduce, which keep rank order");
    detail::ring_allreduce_segmented(tp, data, op, detail::ring_segment_elements<T>(tp), detail::ring_window);
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::allreduce, ring> = [](auto&... a) { ring_allreduce(a...); };
}

} // namespace chorus
